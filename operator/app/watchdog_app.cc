#include "operator/app/watchdog_app.h"

#include <thread>

#include "operator/app/process.h"
#include "operator/common/log.h"
#include "operator/common/wall_clock.h"
#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/watchdog/status_watchdog.h"

namespace spawnpoint::op {

int RunStatusWatchdog(const WatchdogOptions& o) {
  // Signals are taken by one thread with sigwait; block them before any thread starts.
  sigset_t signals = BlockStopSignals();
  const std::string identity = StartLogging(o.log_level, o.identity);
  const Logger log({{"component", kStatusWatchdogComponent}, {"identity", identity}});

  auto config = o.kubeconfig.empty() ? kube::LoadDefaultConfig(o.context)
                                     : kube::LoadKubeconfig(o.kubeconfig, o.context);
  if (!config.ok()) {
    log.Error("cannot load the Kubernetes configuration", {{"error", config.status().message()}});
    return 2;
  }
  kube::ClientOptions client_options;
  client_options.user_agent = std::string(kStatusWatchdogComponent) + "/" + identity;
  client_options.field_manager = kStatusWatchdogComponent;
  client_options.qps = 5;
  client_options.burst = 20;
  Logger kube_log({{"component", "kube"}, {"identity", identity}});
  client_options.logger = [kube_log](kube::LogLevel l, const std::string& message) {
    if (l == kube::LogLevel::kWarning || l == kube::LogLevel::kError) kube_log.Warning(message);
  };
  auto client = kube::Client::Connect(*config, client_options);
  if (!client.ok()) {
    log.Error("cannot create the Kubernetes client", {{"error", client.status().message()}});
    return 2;
  }

  WallClock wall(RealClock::Get());
  StatusWatchdogOptions options{.lease_namespace = o.lease_namespace,
                                .lease_name = o.lease_name,
                                .namespaces = o.namespaces,
                                .stale_after = o.stale_after,
                                .interval = o.interval,
                                .identity = identity};
  StatusWatchdog watchdog(client->get(), &wall, options, log);
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    log.Info("stopping", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
    watchdog.Stop();
  });
  watchdog.Run();
  signal_thread.join();
  log.Info("stopped");
  return 0;
}

}  // namespace spawnpoint::op
