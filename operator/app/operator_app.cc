#include "operator/app/operator_app.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "operator/common/log.h"
#include "operator/common/object.h"
#include "operator/common/wall_clock.h"
#include "operator/controller/controller.h"
#include "operator/http/http_server.h"
#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/leader_election.h"
#include "operator/metrics/metrics.h"
#include "operator/utilisation/agent_status.h"
#include "operator/utilisation/utilisation_poller.h"

namespace spawnpoint::op {
namespace {

// Set by the signal thread or a lost leadership; main waits on it.
struct StopSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  int exit_code = 0;

  void Trigger(int code) {
    std::lock_guard<std::mutex> lock(mu);
    if (!stop) exit_code = code;
    stop = true;
    cv.notify_all();
  }
  bool WaitFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, d, [&] { return stop; });
  }
  bool Stopped() {
    std::lock_guard<std::mutex> lock(mu);
    return stop;
  }
};

std::string DefaultIdentity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "_" + std::to_string(getpid());
}

kube::Logger KubeLogger(const Logger& log) {
  return [log](kube::LogLevel level, const std::string& message) {
    switch (level) {
      case kube::LogLevel::kDebug:
        log.Debug(message);
        break;
      case kube::LogLevel::kInfo:
        log.Info(message);
        break;
      case kube::LogLevel::kWarning:
        log.Warning(message);
        break;
      case kube::LogLevel::kError:
        log.Error(message);
        break;
    }
  };
}

// Per-job gauges, computed from the job cache at scrape time.
std::vector<Sample> JobSamples(const kube::Store& jobs) {
  static const char* kPhases[] = {"Pending",   "Running", "Restarting",
                                  "Succeeded", "Failed",  "Suspended"};
  std::vector<Sample> out;
  for (const auto& job : jobs.List()) {
    const std::string ns = NamespaceOf(*job), name = NameOf(*job);
    const nlohmann::json status = job->value("status", nlohmann::json::object());
    const std::string current = status.value("phase", "");
    auto labels = [&](std::vector<std::pair<std::string, std::string>> more = {}) {
      std::vector<std::pair<std::string, std::string>> l = {{"namespace", ns}, {"name", name}};
      l.insert(l.end(), more.begin(), more.end());
      return l;
    };
    for (const char* p : kPhases) {
      out.push_back({"spawnpoint_trainingjob_status_phase", labels({{"phase", p}}),
                     current == p ? 1.0 : 0.0});
    }
    out.push_back({"spawnpoint_trainingjob_restarts", labels(),
                   static_cast<double>(status.value("restarts", 0))});
    out.push_back({"spawnpoint_trainingjob_world_size", labels(),
                   static_cast<double>(status.value("worldSize", 0))});
    const nlohmann::json nodes = status.value("nodes", nlohmann::json::object());
    for (const char* state : {"pending", "running", "succeeded", "failed"}) {
      out.push_back({"spawnpoint_trainingjob_nodes", labels({{"state", state}}),
                     static_cast<double>(nodes.value(state, 0))});
    }
    const nlohmann::json u = status.value("utilisation", nlohmann::json::object());
    for (const auto& [field, metric] : std::vector<std::pair<std::string, std::string>>{
             {"gpu", "spawnpoint_trainingjob_gpu_utilisation"},
             {"dataStall", "spawnpoint_trainingjob_data_stall"},
             {"samplesPerSecond", "spawnpoint_trainingjob_samples_per_second"}}) {
      if (u.contains(field) && u[field].is_number()) {
        out.push_back({metric, labels(), u[field].get<double>()});
      }
    }
  }
  return out;
}

}  // namespace

int RunOperator(const OperatorOptions& o) {
  // Signals are taken by one thread with sigwait; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(o.log_level, &level);
  SetLogLevel(level);
  const std::string identity = o.identity.empty() ? DefaultIdentity() : o.identity;
  const Logger log = Logger({{"component", "operator"}, {"identity", identity}});

  auto config = o.kubeconfig.empty() ? kube::LoadDefaultConfig(o.context)
                                     : kube::LoadKubeconfig(o.kubeconfig, o.context);
  if (!config.ok()) {
    log.Error("cannot load the Kubernetes configuration", {{"error", config.status().message()}});
    return 2;
  }
  kube::ClientOptions client_options;
  client_options.qps = o.kube_api_qps;
  client_options.burst = o.kube_api_burst;
  client_options.user_agent = "spawnpoint-operator/" + identity;
  client_options.field_manager = "spawnpoint-operator";
  client_options.logger = KubeLogger(Logger({{"component", "kube"}, {"identity", identity}}));
  auto client = kube::Client::Connect(*config, client_options);
  if (!client.ok()) {
    log.Error("cannot create the Kubernetes client", {{"error", client.status().message()}});
    return 2;
  }
  log.Info("starting", {{"server", (*client)->server()},
                        {"namespace", o.ns.empty() ? "(all)" : o.ns},
                        {"leaderElect", o.leader_elect ? "true" : "false"}});

  StopSignal stop;
  std::atomic<bool> signal_taken{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    signal_taken = true;
    if (!stop.Stopped()) {
      log.Info("stopping", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
      stop.Trigger(0);
    }
  });
  auto end_signal_thread = [&] {
    // Wakes the signal thread when it is still waiting (stopped for another reason).
    if (!signal_taken) pthread_kill(signal_thread.native_handle(), SIGTERM);
    signal_thread.join();
  };

  WallClock wall(RealClock::Get());
  Metrics metrics;
  HttpAgentStatusReader reader;
  Controller* controller_ptr = nullptr;
  UtilisationOptions util_options{o.utilisation_interval, o.agent_status_port};
  UtilisationPoller poller(
      &reader, &wall, util_options,
      [&] { return controller_ptr ? controller_ptr->RunningJobs() : std::vector<RunningJob>(); },
      [&](const std::string& ns, const std::string& name) {
        if (controller_ptr) controller_ptr->Enqueue(ns, name);
      });

  ControllerOptions co;
  co.ns = o.ns;
  co.workers = o.max_concurrent_reconciles;
  co.resync_period = o.resync_period;
  co.instance = identity;
  co.reconciler.pods.agent_image = o.agent_image;
  co.reconciler.pods.agent_path = o.agent_path;
  co.reconciler.pods.master_addr = o.master_addr;
  co.reconciler.pods.status_port = o.agent_status_port;
  co.reconciler.pending_timeout = o.pending_timeout;
  if (o.crash_after_pod_creates > 0) {
    auto created = std::make_shared<std::atomic<int>>(0);
    const int limit = o.crash_after_pod_creates;
    co.reconciler.after_pod_create = [created, limit, log](const std::string& pod) {
      if (created->fetch_add(1) + 1 >= limit) {
        log.Warning("--crash-after-pod-creates: exiting abruptly", {{"pod", pod}});
        _exit(99);
      }
    };
  }
  Controller controller(client->get(), &wall, co, &metrics, &poller, log);
  controller_ptr = &controller;
  metrics.AddCollector(
      [&] { return JobSamples(controller.jobs()); },
      {{"spawnpoint_trainingjob_status_phase", "1 for the job's current phase."},
       {"spawnpoint_trainingjob_restarts", "Whole-gang restarts so far."},
       {"spawnpoint_trainingjob_world_size", "DDP ranks of the job."},
       {"spawnpoint_trainingjob_nodes", "Pods of the current attempt by state."},
       {"spawnpoint_trainingjob_gpu_utilisation",
        "Mean GPU utilisation of the running pods (0-1)."},
       {"spawnpoint_trainingjob_data_stall", "Mean fraction of time ranks waited for data (0-1)."},
       {"spawnpoint_trainingjob_samples_per_second", "Samples per second over all ranks."}},
      {});

  std::unique_ptr<kube::LeaderElector> elector;
  std::atomic<bool> synced{false};
  auto ready = [&]() -> std::pair<bool, std::string> {
    if (!synced) return {false, "caches not synced"};
    if (!elector) return {true, "ok"};
    if (elector->IsLeader()) return {true, "ok: leading"};
    if (!elector->GetLeader().empty()) return {true, "ok: standing by for " + elector->GetLeader()};
    return {false, "campaigning"};
  };
  HttpHandler handler = [&](const std::string& path) -> HttpReply {
    if (path == "/healthz" || path == "/livez") return {200, "text/plain; charset=utf-8", "ok\n"};
    if (path == "/readyz") {
      auto [ok, why] = ready();
      return {ok ? 200 : 503, "text/plain; charset=utf-8", why + "\n"};
    }
    if (path == "/metrics") {
      return {200, "text/plain; version=0.0.4; charset=utf-8", metrics.Exposition()};
    }
    return {404, "text/plain; charset=utf-8", "not found\n"};
  };
  std::vector<std::unique_ptr<HttpServer>> servers;
  for (const std::string& addr : {o.health_addr, o.metrics_addr}) {
    if (addr.empty() || addr == "0") continue;
    if (!servers.empty() && addr == o.health_addr) continue;  // same address: one server
    auto server = HttpServer::Start(addr, handler);
    if (!server.ok()) {
      log.Error("cannot serve", {{"addr", addr}, {"error", server.status().message()}});
      controller.Stop();
      end_signal_thread();
      return 2;
    }
    log.Info("serving", {{"addr", addr}, {"port", (*server)->port()}});
    servers.push_back(std::move(server).value());
  }

  controller.StartInformers();
  while (!controller.WaitForSync(std::chrono::milliseconds(200))) {
    if (stop.Stopped()) break;
  }
  if (!stop.Stopped()) {
    synced = true;
    log.Info("caches synced", {{"jobs", static_cast<int64_t>(controller.jobs().Size())}});
  }

  std::thread elector_thread;
  auto start_acting = [&] {
    metrics.SetLeader(true);
    controller.StartWorkers();
    poller.Start();
  };
  if (!stop.Stopped() && o.leader_elect) {
    kube::LeaderElectionConfig lec;
    lec.lease_namespace = !o.leader_elect_namespace.empty() ? o.leader_elect_namespace
                          : !o.ns.empty()                   ? o.ns
                                                            : (*client)->default_namespace();
    lec.lease_name = o.leader_elect_name;
    lec.identity = identity;
    lec.lease_duration = o.lease_duration;
    lec.renew_deadline = o.renew_deadline;
    lec.retry_period = o.retry_period;
    lec.callbacks.on_started_leading = [&] {
      log.Info("became the leader");
      start_acting();
    };
    lec.callbacks.on_stopped_leading = [&] {
      metrics.SetLeader(false);
      log.Warning("leadership ended: stopping");
      stop.Trigger(1);
    };
    lec.callbacks.on_new_leader = [&](const std::string& leader) {
      if (leader != identity) log.Info("following", {{"leader", leader}});
    };
    auto created = kube::LeaderElector::Create(client->get(), lec);
    if (!created.ok()) {
      log.Error("leader election", {{"error", created.status().message()}});
      controller.Stop();
      end_signal_thread();
      return 2;
    }
    elector = std::move(created).value();
    elector_thread = std::thread([&] { elector->Run(); });
  } else if (!stop.Stopped()) {
    start_acting();
  }

  while (!stop.WaitFor(std::chrono::seconds(1))) {
    metrics.SetQueueDepth(static_cast<int64_t>(controller.queue().Len()));
  }
  int code;
  {
    std::lock_guard<std::mutex> lock(stop.mu);
    code = stop.exit_code;
  }
  // Stop acting first, then hand the lease over, so two leaders never overlap.
  poller.Stop();
  controller.Stop();
  if (elector) {
    elector->Stop();
    if (elector_thread.joinable()) elector_thread.join();
  }
  for (auto& s : servers) s->Stop();
  end_signal_thread();
  log.Info("stopped", {{"exitCode", code}});
  return code;
}

}  // namespace spawnpoint::op
