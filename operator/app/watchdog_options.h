// Command-line flags of `spawnpoint-operator status-watchdog` (operator/watchdog/
// status_watchdog.h). Parsing is pure; errors name the flag and what is allowed (the caller
// prints them and exits 2).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::op {

struct WatchdogOptions {
  bool help = false;
  std::string kubeconfig;  // "": in-cluster, else $KUBECONFIG or ~/.kube/config
  std::string context;
  std::string lease_namespace;  // required: the operator's --leader-elect-namespace
  std::string lease_name = "spawnpoint-operator";
  std::vector<std::string> namespaces;  // the operator's --namespace; empty: every namespace
  Clock::Duration stale_after = std::chrono::seconds(45);
  Clock::Duration interval = std::chrono::seconds(5);
  std::string identity;  // "": hostname_pid
  std::string log_level = "info";
};

// `args` are those after the word status-watchdog.
StatusOr<WatchdogOptions> ParseWatchdogArgs(const std::vector<std::string>& args);
std::string WatchdogUsage();

}  // namespace spawnpoint::op
