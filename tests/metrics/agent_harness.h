// Runs the real spawnpoint-agent for the metrics tests and finds its endpoint: the agent is
// started with --metrics-addr 127.0.0.1:0 and says where it listens on stderr. Also finds
// and runs promtool. Not thread-safe; one instance per test.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/test_process.h"

namespace spawnpoint::testing {

// A GPU job of `gpus` ranks under the fake NVML, trained by the loader test trainer (it links
// the loader, so the agent gives every rank a pool of one worker), running until stopped.
std::string LoaderGpuJobManifest(const std::string& trainer_bin, int gpus);
// A CPU job of `ranks` ranks on `nodes` nodes running spawnpoint-test-rank with `args`.
std::string TestRankJobManifest(const std::string& test_rank_bin, int nodes, int ranks,
                                const std::vector<std::string>& args, int max_restarts = 0);

class AgentUnderTest {
 public:
  // Writes `manifest` to a temp dir and runs `agent_bin run -f <it> <extra...>` there, with
  // `env` added to this process's environment (by default the pod identity variables
  // POD_NAME, POD_NAMESPACE, CONTAINER_NAME and NODE_NAME, set to known values).
  AgentUnderTest(const std::string& agent_bin, const std::string& manifest,
                 std::vector<std::string> extra,
                 std::map<std::string, std::string> env = DefaultEnv());
  ~AgentUnderTest();  // SIGTERM, then waits; SIGKILL if it does not stop

  static std::map<std::string, std::string> DefaultEnv();

  // The ports of every "metrics on http://HOST:PORT/metrics" line, once `count` of them were
  // printed (one per node agent), or empty after `timeout`.
  std::vector<int> WaitForEndpoints(size_t count = 1,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // GET path on `port`; "" on any failure or a status other than 200.
  std::string Get(int port, const std::string& path);
  TestProcess& process() { return *process_; }
  std::string Stderr() const { return process_->Stderr(); }
  int Stop();  // SIGTERM and wait; the exit code

 private:
  TempDir dir_;
  std::unique_ptr<TestProcess> process_;
  bool stopped_ = false;
};

// The path of an executable on PATH (or /usr/bin), or nullopt.
std::optional<std::string> FindProgram(const std::string& name);

struct PromtoolResult {
  int code = -1;
  std::string output;  // stdout and stderr
};
// `promtool check metrics` on `text`; nullopt without promtool.
std::optional<PromtoolResult> PromtoolCheckMetrics(const std::string& text);

}  // namespace spawnpoint::testing
