// The operator binary against kube-test-server, driven like a user drives it: the CRD and
// jobs applied with the real kubectl, pods finished by patching pods/status as a kubelet
// would. Every wait polls with a deadline (never a sleep as synchronisation). Test-side
// API calls retry injected faults (409/429/5xx), so fault tests only stress the operator.
// Not thread-safe: one harness per test.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/apiserver/test_server.h"
#include "tests/support/test_process.h"

namespace spawnpoint::op::testing {

using nlohmann::json;
using spawnpoint::kubetest::testing::KubeTestServer;
using spawnpoint::testing::TempDir;
using spawnpoint::testing::TestProcess;

struct KubectlResult {
  int code = -1;
  std::string out, err;
};

class OperatorHarness {
 public:
  // Starts the server (extra flags appended to --simulate-nodes 2 unless given) and applies
  // crds/trainingjob.yaml with kubectl.
  explicit OperatorHarness(std::vector<std::string> server_args = {"--simulate-nodes", "2"});
  ~OperatorHarness();

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  KubeTestServer& server() { return *server_; }
  const std::string& dir() const { return dir_.path(); }

  // Starts a spawnpoint-operator with the test flags plus `extra`; index in operators().
  int StartOperator(const std::vector<std::string>& extra = {},
                    const std::string& identity = "op-0");
  TestProcess& op(int index = 0) { return *operators_.at(index); }
  // The port its probes and metrics are served on (parsed from its log), or 0.
  int ProbePort(int index = 0, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The operator's log so far.
  std::string Log(int index = 0) { return operators_.at(index)->Stderr(); }

  KubectlResult Kubectl(const std::vector<std::string>& args);
  // Writes `object` to a temp file and applies it with kubectl; true on exit 0.
  bool Apply(const json& object);

  // API calls (JSON), retried on 409/429/5xx up to 20 times; the last answer.
  kubetest::testing::HttpResponse Api(const std::string& method, const std::string& path,
                                      const std::string& body = "",
                                      const std::string& content_type = "application/json");
  json Job(const std::string& name, const std::string& ns = "default");  // null if absent
  // The job's pods (items), by name order.
  json Pods(const std::string& job, const std::string& ns = "default");
  json Pod(const std::string& name);  // null if absent
  bool HasService(const std::string& name);
  std::vector<json> Events(const std::string& job);
  // Pod status as a kubelet reports it.
  void SucceedPod(const std::string& pod, const std::string& ns = "default");
  void FailPod(const std::string& pod, int exit_code, const std::string& reason = "Error",
               const std::string& message = "");

  // Polls until `condition` holds; false after `timeout`.
  bool WaitFor(const std::function<bool()>& condition,
               std::chrono::milliseconds timeout = std::chrono::seconds(15));
  std::string Phase(const std::string& job, const std::string& ns = "default");
  bool WaitPhase(const std::string& job, const std::string& phase,
                 std::chrono::milliseconds timeout = std::chrono::seconds(15),
                 const std::string& ns = "default");

 private:
  TempDir dir_;
  std::unique_ptr<KubeTestServer> server_;
  std::vector<std::unique_ptr<TestProcess>> operators_;
  std::string error_;
  std::string kubectl_;  // the pinned kubectl, or env KUBECTL
  int files_ = 0;
};

// A job of `nodes` CPU nodes with one rank each, backoffSeconds 1, as JSON.
json TestJob(const std::string& name, int nodes = 2, int max_restarts = 3, int backoff = 1);

std::string JsonField(const json& object, const std::string& pointer);

}  // namespace spawnpoint::op::testing
