#include "tests/metrics/agent_harness.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <sstream>

#include "tests/metrics/http_client.h"

namespace spawnpoint::testing {

using std::chrono::milliseconds;

std::string LoaderGpuJobManifest(const std::string& trainer_bin, int gpus) {
  std::ostringstream y;
  y << "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\n"
    << "metadata: {name: metrics-demo, namespace: ml}\n"
    << "spec:\n  nodes: 1\n  gpusPerNode: " << gpus << "\n  shmSize: 64Mi\n"
    << "  loader: {workersPerRank: 1}\n"
    << "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: test\n"
    << "        command: [\"" << trainer_bin
    << "\"]\n"
    // A slow consumer: about 50 batches a second per rank, for as long as the test runs.
    << "        args: [\"--epochs\", \"1000000\", \"--sleep-ms\", \"20\"]\n";
  return y.str();
}

std::string TestRankJobManifest(const std::string& test_rank_bin, int nodes, int ranks,
                                const std::vector<std::string>& args, int max_restarts) {
  std::ostringstream y;
  y << "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\n"
    << "metadata: {name: rank-demo, namespace: ml}\n"
    << "spec:\n  nodes: " << nodes << "\n  procsPerNode: " << ranks << "\n  shmSize: 64Mi\n"
    << "  restartPolicy: {maxRestarts: " << max_restarts << ", backoffSeconds: 0}\n"
    << "  template:\n    spec:\n      containers:\n      - name: trainer\n        image: test\n"
    << "        command: [\"" << test_rank_bin << "\"]\n        args: [";
  for (size_t i = 0; i < args.size(); ++i) y << (i ? ", " : "") << "\"" << args[i] << "\"";
  y << "]\n";
  return y.str();
}

std::map<std::string, std::string> AgentUnderTest::DefaultEnv() {
  return {{"POD_NAME", "metrics-demo-node-0"},
          {"POD_NAMESPACE", "ml"},
          {"CONTAINER_NAME", "trainer"},
          {"NODE_NAME", "gpu-node-7"}};
}

AgentUnderTest::AgentUnderTest(const std::string& agent_bin, const std::string& manifest,
                               std::vector<std::string> extra,
                               std::map<std::string, std::string> env) {
  WriteFile(dir_.File("job.yaml"), manifest);
  std::vector<std::string> argv = {agent_bin,
                                   "run",
                                   "-f",
                                   dir_.File("job.yaml"),
                                   "--master-port",
                                   "0",
                                   "--grace-period",
                                   "5",
                                   "--termination-log",
                                   dir_.File("termination-log")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  process_ = std::make_unique<TestProcess>(argv, env, dir_.path());
}

AgentUnderTest::~AgentUnderTest() { Stop(); }

int AgentUnderTest::Stop() {
  if (stopped_) return -1;
  stopped_ = true;
  if (process_->Running()) kill(process_->pid(), SIGTERM);
  return process_->Wait(milliseconds(30'000));
}

std::vector<int> AgentUnderTest::WaitForEndpoints(size_t count, milliseconds timeout) {
  static const std::regex line(R"(metrics on http://[^ ]*:([0-9]+)/metrics)");
  std::vector<int> ports;
  WaitUntil(
      [&] {
        ports.clear();
        const std::string err = process_->Stderr();
        for (auto it = std::sregex_iterator(err.begin(), err.end(), line);
             it != std::sregex_iterator(); ++it) {
          ports.push_back(std::stoi((*it)[1]));
        }
        return ports.size() >= count || !process_->Running();
      },
      timeout);
  if (ports.size() < count) ports.clear();
  return ports;
}

std::string AgentUnderTest::Get(int port, const std::string& path) {
  auto r = HttpGet("127.0.0.1", port, path);
  return r.ok() && r->status == 200 ? r->body : "";
}

std::optional<std::string> FindProgram(const std::string& name) {
  std::string path = getenv("PATH") ? getenv("PATH") : "";
  path += ":/usr/bin:/usr/local/bin";
  std::istringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::optional<PromtoolResult> PromtoolCheckMetrics(const std::string& text) {
  auto promtool = FindProgram("promtool");
  if (!promtool) return std::nullopt;
  TempDir dir;
  WriteFile(dir.File("metrics.txt"), text);
  TestProcess p(
      {"/bin/sh", "-c", "\"$0\" check metrics < \"$1\" 2>&1", *promtool, dir.File("metrics.txt")});
  PromtoolResult r;
  r.code = p.Wait(milliseconds(60'000));
  r.output = p.Stdout();
  return r;
}

}  // namespace spawnpoint::testing
