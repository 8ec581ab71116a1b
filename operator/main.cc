// spawnpoint-operator: TrainingJobs → gangs of spawn-DDP pods. See operator/app/.
// `spawnpoint-operator status-watchdog ...`: the status watchdog (operator/watchdog/).
#include <iostream>
#include <string>
#include <vector>

#include "common/version.h"
#include "operator/app/operator_app.h"
#include "operator/app/options.h"
#include "operator/app/watchdog_app.h"
#include "operator/app/watchdog_options.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "status-watchdog") {
    auto watchdog = spawnpoint::op::ParseWatchdogArgs({args.begin() + 1, args.end()});
    if (!watchdog.ok()) {
      std::cerr << "spawnpoint-operator: " << watchdog.status().message() << "\n";
      return 2;
    }
    if (watchdog->help) {
      std::cout << spawnpoint::op::WatchdogUsage();
      return 0;
    }
    return spawnpoint::op::RunStatusWatchdog(*watchdog);
  }
  auto options = spawnpoint::op::ParseOperatorArgs(args);
  if (!options.ok()) {
    std::cerr << "spawnpoint-operator: " << options.status().message() << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << spawnpoint::op::OperatorUsage();
    return 0;
  }
  if (options->version) {
    std::cout << "spawnpoint-operator " << spawnpoint::kVersion << "\n";
    return 0;
  }
  return spawnpoint::op::RunOperator(*options);
}
