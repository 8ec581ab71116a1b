// spawnpoint-agent: runs a TrainingJob's ranks on one node as spawned processes.
#include <signal.h>

#include <iostream>
#include <string>
#include <vector>

#include "agent/cli/commands.h"
#include "agent/cli/options.h"
#include "common/version.h"

int main(int argc, char** argv) {
  using namespace spawnpoint::agent;
  // Before any thread exists, so every thread inherits the blocked signals.
  auto signals = SignalWatcher::Create();
  if (!signals.ok()) {
    std::cerr << "spawnpoint-agent: " << signals.status().message() << "\n";
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  auto options = ParseAgentArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::cerr << "spawnpoint-agent: " << options.status().message() << "\n";
    return 2;
  }
  switch (options->command) {
    case AgentCommand::kHelp:
      std::cout << AgentUsage();
      return 0;
    case AgentCommand::kVersion:
      std::cout << "spawnpoint-agent " << spawnpoint::kVersion << "\n";
      return 0;
    case AgentCommand::kPlan:
      return PlanCommand(*options);
    case AgentCommand::kRun:
      return RunCommand(*options, signals->get());
  }
  return 1;
}
