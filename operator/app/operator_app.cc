#include "operator/app/operator_app.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "metrics/registry.h"
#include "metrics/server.h"
#include "operator/app/process.h"
#include "operator/common/log.h"
#include "operator/common/object.h"
#include "operator/common/status_token.h"
#include "operator/common/wall_clock.h"
#include "operator/controller/controller.h"
#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/leader_election.h"
#include "operator/metrics/operator_metrics.h"
#include "operator/utilisation/agent_status.h"
#include "operator/utilisation/gang_watcher.h"
#include "operator/utilisation/utilisation_poller.h"

namespace spawnpoint::op {
namespace {

// "(all)", or the namespaces separated by commas, as --namespace takes them.
std::string WatchedNamespaces(const std::vector<std::string>& namespaces) {
  if (namespaces.empty()) return "(all)";
  std::string out;
  for (const auto& ns : namespaces) out += (out.empty() ? "" : ",") + ns;
  return out;
}

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

}  // namespace

int RunOperator(const OperatorOptions& o) {
  // Signals are taken by one thread with sigwait; block them before any thread starts.
  sigset_t signals = BlockStopSignals();
  const std::string identity = StartLogging(o.log_level, o.identity);
  const Logger log = Logger({{"component", "operator"}, {"identity", identity}});

  auto config = o.kubeconfig.empty() ? kube::LoadDefaultConfig(o.context)
                                     : kube::LoadKubeconfig(o.kubeconfig, o.context);
  if (!config.ok()) {
    log.Error("cannot load the Kubernetes configuration", {{"error", config.status().message()}});
    return 2;
  }
  // Each job's status token: the agents serve their log lines to it (common/status_token.h).
  std::optional<StatusTokens> status_tokens;
  if (o.status_token_key_file != "off") {
    StatusOr<StatusTokens> tokens = o.status_token_key_file.empty()
                                        ? StatusTokens::Random()
                                        : StatusTokens::FromFile(o.status_token_key_file);
    if (!tokens.ok()) {
      log.Error("cannot make the agents' status tokens", {{"error", tokens.status().message()}});
      return 2;
    }
    status_tokens = std::move(*tokens);
    if (o.status_token_key_file.empty()) {
      log.Info(
          "status tokens from a random key: after this operator restarts, the agents of jobs "
          "started before serve it their status without log lines (give "
          "--status-token-key-file to keep the key)");
    }
  }
  // Before the client: it reports every API request here.
  metrics::Registry registry;
  OperatorMetrics metrics(&registry);
  kube::ClientOptions client_options;
  client_options.on_response = [&metrics](const std::string& verb, int code, Clock::Duration took) {
    metrics.ObserveApiRequest(verb, code, std::chrono::duration<double>(took).count());
  };
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
                        {"namespace", WatchedNamespaces(o.namespaces)},
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
  HttpAgentStatusReader reader;
  Controller* controller_ptr = nullptr;
  UtilisationOptions util_options{o.utilisation_interval, o.agent_status_port};
  UtilisationPoller poller(
      &reader, &wall, util_options,
      [&] { return controller_ptr ? controller_ptr->RunningJobs() : std::vector<RunningJob>(); },
      [&](const std::string& ns, const std::string& name) {
        if (controller_ptr) controller_ptr->Enqueue(ns, name);
      });

  // The in-place gangs' agents, read more often and with a shorter timeout than utilisation.
  HttpAgentStatusReader gang_reader(std::chrono::seconds(1));
  GangWatcher gang_watcher(
      &gang_reader, &wall, GangWatchOptions{o.gang_status_interval, o.agent_status_port},
      [&] { return controller_ptr ? controller_ptr->GangJobs() : std::vector<GangJob>(); },
      [&](const std::string& ns, const std::string& name) {
        if (controller_ptr) controller_ptr->Enqueue(ns, name);
      });

  ControllerOptions co;
  co.namespaces = o.namespaces;
  co.workers = o.max_concurrent_reconciles;
  co.resync_period = o.resync_period;
  co.instance = identity;
  co.reconciler.pods.agent_image = o.agent_image;
  co.reconciler.pods.agent_path = o.agent_path;
  co.reconciler.pods.master_addr = o.master_addr;
  co.reconciler.pods.status_port = o.agent_status_port;
  co.reconciler.pods.gang_port = o.agent_gang_port;
  co.reconciler.gang = &gang_watcher;
  co.reconciler.pending_timeout = o.pending_timeout;
  co.reconciler.quota_retry = {o.quota_retry, o.quota_retry_max};
  co.watch_quotas = o.watch_quotas;
  co.reconciler.status_tokens = status_tokens ? &*status_tokens : nullptr;
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
  metrics.CollectJobs(&controller.jobs(), &wall);

  std::thread elector_thread;
  auto start_acting = [&] {
    metrics.SetLeader(true);
    controller.StartWorkers();
    poller.Start();
    gang_watcher.Start();
  };
  // Created before the probes are served, so /readyz never sees it appear.
  std::unique_ptr<kube::LeaderElector> elector;
  if (o.leader_elect) {
    kube::LeaderElectionConfig lec;
    lec.lease_namespace = LeaseNamespace(o, (*client)->default_namespace());
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
  }
  std::atomic<bool> synced{false};
  // Ready once the caches synced and, with leader election, once leading or following a
  // known leader. Read live on every probe.
  auto readyz = [&](const metrics::HttpRequest&) {
    auto text = [](int code, std::string body) {
      return metrics::HttpResponse{code, "text/plain; charset=utf-8", body + "\n"};
    };
    if (!synced) return text(503, "not ready: caches not synced");
    if (!elector) return text(200, "ok");
    if (elector->IsLeader()) return text(200, "ok: leading");
    const std::string leader = elector->GetLeader();
    if (!leader.empty()) return text(200, "ok: standing by for " + leader);
    return text(503, "not ready: campaigning");
  };
  // /metrics, /healthz and /readyz on the metrics address; the probes also on the health
  // address when it differs (probes then never queue behind a slow scrape).
  std::vector<std::unique_ptr<metrics::MetricsServer>> servers;
  for (const std::string& addr : {o.metrics_addr, o.health_addr}) {
    if (addr.empty()) continue;                                // off
    if (!servers.empty() && addr == o.metrics_addr) continue;  // same address: one server
    auto server = metrics::MetricsServer::Start(
        {.address = addr, .registry = addr == o.metrics_addr ? &registry : nullptr});
    if (!server.ok()) {
      log.Error("cannot serve", {{"addr", addr}, {"error", server.status().message()}});
      controller.Stop();
      end_signal_thread();
      return 2;
    }
    (*server)->Handle("/livez", [](const metrics::HttpRequest&) {
      return metrics::HttpResponse{.body = "ok\n"};
    });
    (*server)->Handle("/readyz", readyz);
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

  if (!stop.Stopped()) {
    if (elector) {
      elector_thread = std::thread([&] { elector->Run(); });
    } else {
      start_acting();
    }
  }

  while (!stop.WaitFor(std::chrono::hours(1))) continue;
  int code;
  {
    std::lock_guard<std::mutex> lock(stop.mu);
    code = stop.exit_code;
  }
  // Stop acting first, then hand the lease over, so two leaders never overlap.
  poller.Stop();
  gang_watcher.Stop();
  controller.Stop();
  if (elector) {
    elector->Stop();
    if (elector_thread.joinable()) elector_thread.join();
  }
  for (auto& s : servers) s->Stop();
  metrics.StopCollectingJobs();
  end_signal_thread();
  log.Info("stopped", {{"exitCode", code}});
  return code;
}

}  // namespace spawnpoint::op
