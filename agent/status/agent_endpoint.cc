#include "agent/status/agent_endpoint.h"

#include "agent/status/status_access.h"

#include <unistd.h>

#include <climits>
#include <map>

namespace spawnpoint::agent {
namespace {

void Say(const std::string& line) {
  std::string s = "[spawnpoint] " + line + "\n";
  (void)!write(2, s.data(), s.size());
}

// The process environment. node_plan.cc has the same, but this library must not link the
// rest of the agent (which links it).
std::map<std::string, std::string> Environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace

bool MetricsDisabled(const std::string& address) { return address.empty() || address == "off"; }

StatusOr<std::unique_ptr<AgentEndpoint>> AgentEndpoint::Start(const std::string& address,
                                                              NodeStatus* status,
                                                              const std::string& status_token) {
  std::unique_ptr<AgentEndpoint> e(new AgentEndpoint());
  SP_ASSIGN_OR_RETURN(e->server_, metrics::MetricsServer::Start(
                                      {.address = address, .registry = &status->registry()}));
  e->server_->Handle("/status", [status, status_token](const metrics::HttpRequest& request) {
    metrics::HttpResponse r;
    r.content_type = "application/json";
    r.body = status->Publish();
    if (!MayReadLogs(status_token, request)) {
      r.body = WithoutLogs(nlohmann::json::parse(r.body)).dump() + "\n";
    }
    return r;
  });
  e->server_->SetReady(false, "ranks not started");
  return e;
}

AgentEndpoint::~AgentEndpoint() {
  if (server_) server_->Stop();
}

void AgentEndpoint::SetReadiness(const std::string& phase, int up, int total) {
  const bool ready = phase == "Running" && up > 0;
  server_->SetReady(ready, ready ? ""
                                 : "phase " + phase + ", " + std::to_string(up) + "/" +
                                       std::to_string(total) + " ranks up");
}

NodeStatusOptions NodeStatusOptionsFor(
    const NodePlan& plan, bool dcgm_compatible_names, devices::GpuBackend* backend,
    const std::vector<std::unique_ptr<loader::PoolSupervisor>>* pools) {
  NodeStatusOptions o;
  o.identity = IdentityFromEnvironment(Environment(), HostName(), plan.job_name, plan.job_namespace,
                                       plan.node_rank);
  o.ranks = RanksOfPlan(plan);
  o.gpus = GpusOfPlan(plan);
  o.gpu_backend = o.gpus.empty() ? nullptr : backend;
  o.gpu_backend_name = backend != nullptr ? backend->Name() : "none";
  if (pools != nullptr && !pools->empty()) {
    o.pool_status = [pools] {
      std::vector<nlohmann::json> out;
      for (const auto& p : *pools) out.push_back(p->StatusJson());
      return out;
    };
  }
  o.dcgm_compatible_names = dcgm_compatible_names;
  o.restart_count = plan.restart_count;
  return o;
}

std::unique_ptr<AgentEndpoint> StartAgentEndpoint(const std::string& address,
                                                  const std::string& job_name, NodeStatus* status,
                                                  const std::string& status_token) {
  if (MetricsDisabled(address)) return nullptr;
  auto endpoint = AgentEndpoint::Start(address, status, status_token);
  if (!endpoint.ok()) {
    Say("warning: " + job_name + ": no metrics or status endpoint: " + endpoint.status().message() +
        " (use --metrics-addr HOST:PORT, or off)");
    return nullptr;
  }
  Say(job_name + ": metrics on http://" + (*endpoint)->address() + "/metrics, status on /status");
  return std::move(endpoint).value();
}

std::string LocalNodeMetricsAddress(const std::string& address, int node) {
  if (MetricsDisabled(address)) return address;
  auto hp = metrics::ParseListenAddress(address);
  if (!hp.ok() || hp->second == 0) return address;
  std::string host = hp->first;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return host + ":" + std::to_string(hp->second + node);
}

}  // namespace spawnpoint::agent
