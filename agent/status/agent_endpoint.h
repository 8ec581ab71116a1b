// The node agent's HTTP endpoint on --metrics-addr (default "127.0.0.1:9400"; ":9400" in a pod):
// /metrics (Prometheus text format 0.0.4), /status (JSON, read by the operator; the document
// NodeStatus::Publish() makes, as --status-file gets it: docs/status.md), /healthz and
// /readyz (ready while the ranks run). It costs one thread and a listening socket; everything is
// computed when asked. A node's training never fails because of its metrics: the agent warns and
// runs on when the address cannot be bound.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "agent/devices/gpu_backend.h"
#include "agent/loader/pool_supervisor.h"
#include "agent/plan/node_plan.h"
#include "agent/status/node_status.h"
#include "common/status.h"
#include "metrics/server.h"

namespace spawnpoint::agent {

// "" and "off" turn the endpoint off.
bool MetricsDisabled(const std::string& address);

class AgentEndpoint {
 public:
  // Serves `status` (not owned; it must outlive the endpoint) on `address`
  // (metrics/server.h's forms): /status is status->Publish(), whole for a reader that
  // MayReadLogs(status_token, ...), else WithoutLogs() of it (status_access.h). Errors as
  // MetricsServer::Start.
  static StatusOr<std::unique_ptr<AgentEndpoint>> Start(const std::string& address,
                                                        NodeStatus* status,
                                                        const std::string& status_token = "");
  ~AgentEndpoint();  // stops the server first, so no request outlives it

  int port() const { return server_->port(); }
  const std::string& address() const { return server_->address(); }

  // Readiness: ready while the phase is Running with ranks up.
  void SetReadiness(const std::string& phase, int up, int total);

 private:
  AgentEndpoint() = default;
  std::unique_ptr<metrics::MetricsServer> server_;
};

// The NodeStatus of this node's plan: its identity from the environment (pod, namespace,
// container, node name), ranks, GPUs and pools. `pools` (may be null) and `backend` (may be
// null; sampled at every reading) must outlive the NodeStatus.
NodeStatusOptions NodeStatusOptionsFor(
    const NodePlan& plan, bool dcgm_compatible_names, devices::GpuBackend* backend,
    const std::vector<std::unique_ptr<loader::PoolSupervisor>>* pools);

// What `spawnpoint-agent run` calls once the node's plan is made and its pools started:
// the endpoint serving `status` (which must outlive it), or nullptr when disabled or when
// it cannot be bound; either outcome is said on stderr ("[spawnpoint] <job>: metrics on
// http://..." or a warning).
std::unique_ptr<AgentEndpoint> StartAgentEndpoint(const std::string& address,
                                                  const std::string& job_name, NodeStatus* status,
                                                  const std::string& status_token = "");

// The address node `node` of a job run entirely on this machine gets, so the node agents do
// not fight over one port: HOST:(PORT + node). Port 0 and a disabled address stay as they
// are; an unparseable address is passed on for the node agent to report.
std::string LocalNodeMetricsAddress(const std::string& address, int node);

}  // namespace spawnpoint::agent
