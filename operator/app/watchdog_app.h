// Runs `spawnpoint-operator status-watchdog`: the Kubernetes client from the kubeconfig (or
// in-cluster) and the StatusWatchdog (operator/watchdog/status_watchdog.h) until SIGTERM or
// SIGINT (exit 0). Exit 2 when the configuration or client cannot be made.
#pragma once

#include "operator/app/watchdog_options.h"

namespace spawnpoint::op {

int RunStatusWatchdog(const WatchdogOptions& options);

}  // namespace spawnpoint::op
