// spawnpoint-operator: TrainingJobs → gangs of spawn-DDP pods. See operator/app/.
#include <iostream>
#include <string>
#include <vector>

#include "common/version.h"
#include "operator/app/operator_app.h"
#include "operator/app/options.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
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
