// The operator binary against a real control plane, driven like a user drives it: the CRD and
// jobs applied with the real kubectl, pods finished by patching pods/status as a kubelet
// would. The control plane is the one scripts/cluster.sh started for the test binary (a ctest
// fixture, OPERATOR_TEST_CLUSTER_DIR; its local node simulates pods: bound ones are Running
// and nothing more), or the cluster SPAWNPOINT_TEST_KUBECONFIG names. Each harness has its own
// namespace (deleted at the end; operators watch only it) and its own kube-fault-proxy
// (tools/faultproxy) in front of the server: every call of the test and the operators goes
// through it, for fault rules and the request log. Every wait polls with a deadline (never a
// sleep as synchronisation). Test-side API calls retry injected faults (409/429/5xx), so fault
// tests only stress the operator. Not thread-safe: one harness per test.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/http_call.h"  // the proxy speaks plain HTTP
#include "tests/support/test_process.h"

namespace spawnpoint::op::testing {

using nlohmann::json;
using spawnpoint::testing::TempDir;
using spawnpoint::testing::TestProcess;

struct KubectlResult {
  int code = -1;
  std::string out, err;
};

using spawnpoint::testing::HttpResponse;

class OperatorHarness {
 public:
  // Starts the proxy in front of `upstream_kubeconfig` (default: the fixture's control plane
  // or SPAWNPOINT_TEST_KUBECONFIG), applies crds/trainingjob.yaml with kubectl and makes the
  // test's namespace.
  explicit OperatorHarness(const std::string& upstream_kubeconfig = "");
  ~OperatorHarness();

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_.path(); }
  const std::string& ns() const { return ns_; }
  // The proxy's kubeconfig (plain HTTP on loopback, the upstream's credentials behind it).
  const std::string& kubeconfig() const { return kubeconfig_; }

  // A call to the proxy as it comes (no retries): the API or its /testing endpoints.
  HttpResponse Call(const std::string& method, const std::string& path,
                    const std::string& body = "",
                    const std::string& content_type = "application/json");
  HttpResponse AddFaults(const std::string& spec);  // JSON or the compact k=v,...;... form
  void ClearFaults();
  json Requests();  // {"requests": [...]}: what went through the proxy
  void ClearRequests();

  // Starts a spawnpoint-operator with the test flags (the harness's namespace only) plus
  // `extra`; index in operators().
  int StartOperator(const std::vector<std::string>& extra = {},
                    const std::string& identity = "op-0");
  TestProcess& op(int index = 0) { return *operators_.at(index); }
  // The port its probes and metrics are served on (parsed from its log), or 0.
  int ProbePort(int index = 0, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The operator's log so far.
  std::string Log(int index = 0) { return operators_.at(index)->Stderr(); }

  KubectlResult Kubectl(const std::vector<std::string>& args);
  // kubectl through the proxy, in the harness's namespace unless args say another.
  // Writes `object` (into the harness's namespace when it names none or "default") to a temp
  // file and applies it with kubectl; true on exit 0.
  bool Apply(const json& object);

  // API calls (JSON), retried on 409/429/5xx up to 20 times; the last answer.
  // Paths below: "$NS" stands for the harness's namespace.
  HttpResponse Api(const std::string& method, const std::string& path, const std::string& body = "",
                   const std::string& content_type = "application/json");
  // Namespace "" is the harness's, in all of these.
  json Job(const std::string& name, const std::string& ns = "");  // null if absent
  // The job's pods (items), by name order.
  json Pods(const std::string& job, const std::string& ns = "");
  json Pod(const std::string& name);  // null if absent
  bool HasService(const std::string& name);
  std::vector<json> Events(const std::string& job);
  // Pod status as a kubelet reports it.
  void SucceedPod(const std::string& pod, const std::string& ns = "");
  void FailPod(const std::string& pod, int exit_code, const std::string& reason = "Error",
               const std::string& message = "");

  // Polls until `condition` holds; false after `timeout`.
  bool WaitFor(const std::function<bool()>& condition,
               std::chrono::milliseconds timeout = std::chrono::seconds(15));
  std::string Phase(const std::string& job, const std::string& ns = "");
  bool WaitPhase(const std::string& job, const std::string& phase,
                 std::chrono::milliseconds timeout = std::chrono::seconds(15),
                 const std::string& ns = "");

 private:
  std::string Ns(const std::string& ns) const { return ns.empty() ? ns_ : ns; }

  TempDir dir_;
  std::unique_ptr<TestProcess> proxy_;
  int proxy_port_ = 0;
  std::string kubeconfig_;
  std::string ns_;
  std::vector<std::unique_ptr<TestProcess>> operators_;
  std::string error_;
  std::string kubectl_;  // the pinned kubectl, or env KUBECTL
  int files_ = 0;
};

// The kubeconfig of the control plane the tests use: SPAWNPOINT_TEST_KUBECONFIG, else the
// fixture's (OPERATOR_TEST_CLUSTER_DIR/admin.kubeconfig).
std::string TestClusterKubeconfig();

// A job of `nodes` CPU nodes with one rank each, backoffSeconds 1, as JSON.
json TestJob(const std::string& name, int nodes = 2, int max_restarts = 3, int backoff = 1);

std::string JsonField(const json& object, const std::string& pointer);

// A TCP port P free on every interface now, with P + 1 free too (tests/support/free_port.h):
// a job's agents serve its gang next to its rendezvous port, and the local node's pods share
// this machine's network with every other test.
int FreePort();

}  // namespace spawnpoint::op::testing
