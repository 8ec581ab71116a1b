#include "tests/operator/harness.h"

#include "tests/support/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>
#include <thread>

namespace spawnpoint::op::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string Now() {
  time_t t = time(nullptr);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

json TestJob(const std::string& name, int nodes, int max_restarts, int backoff) {
  return {{"apiVersion", "spawnpoint.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"nodes", nodes},
            {"procsPerNode", 1},
            {"template",
             {{"spec",
               {{"containers", json::array({{{"name", "trainer"},
                                             {"image", "trainer:1"},
                                             {"command", {"python3", "train.py"}}}})}}}}},
            // Recreate: these tests play the kubelet, with no agents to restart in place.
            {"restartPolicy",
             {{"mode", "Recreate"}, {"maxRestarts", max_restarts}, {"backoffSeconds", backoff}}},
            {"shmSize", "1Gi"}}}};
}

std::string JsonField(const json& object, const std::string& pointer) {
  json::json_pointer p(pointer);
  if (!object.is_object() || !object.contains(p)) return "";
  const json& v = object.at(p);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string TestClusterKubeconfig() {
  const char* env = std::getenv("SPAWNPOINT_TEST_KUBECONFIG");
  if (env && *env) return env;
  return std::string(OPERATOR_TEST_CLUSTER_DIR) + "/admin.kubeconfig";
}

OperatorHarness::OperatorHarness(const std::string& upstream_kubeconfig) {
  const std::string upstream =
      upstream_kubeconfig.empty() ? TestClusterKubeconfig() : upstream_kubeconfig;
  // The pinned kubectl (tests/CMakeLists.txt); env KUBECTL overrides it.
  const char* env = std::getenv("KUBECTL");
  kubectl_ = env && *env ? env : KUBECTL_BIN;
  if (access(kubectl_.c_str(), X_OK) != 0) {
    error_ = "no kubectl at " + kubectl_ +
             ": run `make deps` (scripts/install-tools.sh builds the pinned kubectl)";
    return;
  }
  if (access(KUBE_FAULT_PROXY, X_OK) != 0) {
    error_ = std::string("no kube-fault-proxy at ") + KUBE_FAULT_PROXY +
             ": run `make deps` (scripts/install-tools.sh --control-plane builds it)";
    return;
  }
  if (access(upstream.c_str(), R_OK) != 0) {
    error_ = "no control plane: " + upstream +
             " is missing (ctest starts one with the operator_cluster fixture: "
             "tests/operator/operator_cluster.sh up " OPERATOR_TEST_CLUSTER_DIR ")";
    return;
  }
  kubeconfig_ = dir_.File("proxy.kubeconfig");
  proxy_ = std::make_unique<TestProcess>(std::vector<std::string>{
      KUBE_FAULT_PROXY, "--upstream-kubeconfig", upstream, "--kubeconfig-out", kubeconfig_});
  static const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
  WaitFor(
      [&] {
        std::smatch m;
        std::string out = proxy_->Stdout();
        if (std::regex_search(out, m, listening)) proxy_port_ = std::stoi(m[1]);
        return proxy_port_ > 0 || !proxy_->Running();
      },
      seconds(20));
  if (proxy_port_ == 0) {
    error_ = "kube-fault-proxy did not start: " + proxy_->Stderr();
    return;
  }
  // The CRD is cluster-wide: applied by every harness, unchanged after the first.
  KubectlResult crd = Kubectl({"apply", "-f", SOURCE_DIR "/crds/trainingjob.yaml"});
  if (crd.code != 0) {
    error_ = "kubectl apply of the CRD failed: " + crd.err;
    return;
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info ? info->name() : "op";
  std::transform(test.begin(), test.end(), test.begin(), [](unsigned char c) {
    return std::isalnum(c) ? static_cast<char>(std::tolower(c)) : '-';
  });
  ns_ = "op-" + test.substr(0, 40) + "-" + std::to_string(getpid());
  json ns = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns_}}}};
  auto created = Api("POST", "/api/v1/namespaces", ns.dump());
  if (created.code != 201) {
    error_ = "creating namespace " + ns_ + ": " + std::to_string(created.code) + " " + created.body;
    return;
  }
  // Pods are admitted once the namespace's default ServiceAccount exists
  // (kube-controller-manager makes it).
  if (!WaitFor(
          [&] {
            return Api("GET", "/api/v1/namespaces/" + ns_ + "/serviceaccounts/default").code == 200;
          },
          seconds(30))) {
    error_ = "the default ServiceAccount of " + ns_ + " did not appear (kube-controller-manager?)";
  }
  // The CRD is served once it is Established: the first apply of a job can come right after.
  if (error_.empty() &&
      !WaitFor([&] { return Api("GET", "/apis/spawnpoint.dev/v1alpha1/trainingjobs").code == 200; },
               seconds(30))) {
    error_ = "the TrainingJob CRD was not served in time";
  }
}

OperatorHarness::~OperatorHarness() {
  for (auto& o : operators_) {
    if (o->Running()) kill(o->pid(), SIGTERM);
  }
  for (auto& o : operators_) o->Wait(seconds(10));
  if (proxy_port_ > 0 && !ns_.empty()) {
    ClearFaults();
    // Background: kube-controller-manager removes what is in it; nothing waits for that.
    Call("DELETE", "/api/v1/namespaces/" + ns_);
  }
  if (proxy_ && proxy_->Running()) kill(proxy_->pid(), SIGTERM);
  if (proxy_) proxy_->Wait(seconds(5));
}

HttpResponse OperatorHarness::Call(const std::string& method, const std::string& path,
                                   const std::string& body, const std::string& content_type) {
  spawnpoint::testing::Headers headers;
  if (!body.empty()) headers.emplace_back("content-type", content_type);
  return spawnpoint::testing::HttpCall(proxy_port_, method, path, body, headers);
}

HttpResponse OperatorHarness::AddFaults(const std::string& spec) {
  return Call("POST", "/testing/faults", spec,
              spec.rfind("{", 0) == 0 ? "application/json" : "text/plain");
}

void OperatorHarness::ClearFaults() { Call("DELETE", "/testing/faults"); }

json OperatorHarness::Requests() {
  auto r = Call("GET", "/testing/requests");
  return r.code == 200 ? r.Json() : json{{"requests", json::array()}};
}

void OperatorHarness::ClearRequests() { Call("DELETE", "/testing/requests"); }

int OperatorHarness::StartOperator(const std::vector<std::string>& extra,
                                   const std::string& identity) {
  std::vector<std::string> argv = {OPERATOR_BIN,  "--kubeconfig",
                                   kubeconfig_,   "--namespace",
                                   ns_,           "--leader-elect-namespace",
                                   ns_,           "--identity",
                                   identity,      "--health-addr",
                                   "127.0.0.1:0", "--metrics-addr",
                                   "127.0.0.1:0", "--utilisation-interval",
                                   "0",           "--log-level",
                                   "debug"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  operators_.push_back(std::make_unique<TestProcess>(argv));
  return static_cast<int>(operators_.size()) - 1;
}

int OperatorHarness::ProbePort(int index, milliseconds timeout) {
  static const std::regex serving("msg=serving .*port=([0-9]+)");
  int port = 0;
  WaitFor(
      [&] {
        std::smatch m;
        std::string log = Log(index);
        if (std::regex_search(log, m, serving)) port = std::stoi(m[1]);
        return port > 0;
      },
      timeout);
  return port;
}

KubectlResult OperatorHarness::Kubectl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kubectl_, "--kubeconfig", kubeconfig_, "--namespace", ns_};
  argv.insert(argv.end(), args.begin(), args.end());
  TestProcess p(argv, {{"KUBECACHEDIR", dir_.File("kubecache")}, {"HOME", dir_.path()}});
  int code = p.Wait(seconds(30));
  return {code, p.Stdout(), p.Stderr()};
}

bool OperatorHarness::Apply(const json& given) {
  json object = given;
  if (object.contains("metadata") &&
      object["metadata"].value("namespace", "default") == "default") {
    object["metadata"]["namespace"] = ns_;
  }
  std::string path = dir_.File("object-" + std::to_string(files_++) + ".json");
  spawnpoint::testing::WriteFile(path, object.dump(2));
  KubectlResult r = Kubectl({"apply", "-f", path});
  if (r.code != 0) ADD_FAILURE_AT(__FILE__, __LINE__) << "kubectl apply: " << r.err;
  return r.code == 0;
}

HttpResponse OperatorHarness::Api(const std::string& method, const std::string& given_path,
                                  const std::string& body, const std::string& content_type) {
  std::string path = given_path;
  for (size_t at; (at = path.find("$NS")) != std::string::npos;) path.replace(at, 3, ns_);
  HttpResponse r;
  for (int attempt = 0; attempt < 20; ++attempt) {
    r = Call(method, path, body, content_type);
    if (r.code != 409 && r.code != 429 && r.code < 500 && r.code != 0) return r;
    std::this_thread::sleep_for(milliseconds(20));  // a retry pause, not synchronisation
  }
  return r;
}

json OperatorHarness::Job(const std::string& name, const std::string& ns) {
  auto r =
      Api("GET", "/apis/spawnpoint.dev/v1alpha1/namespaces/" + Ns(ns) + "/trainingjobs/" + name);
  return r.code == 200 ? r.Json() : json();
}

json OperatorHarness::Pods(const std::string& job, const std::string& ns) {
  auto r = Api("GET", "/api/v1/namespaces/" + Ns(ns) +
                          "/pods?labelSelector=spawnpoint.dev%2Fjob-name%3D" + job);
  if (r.code != 200) return json::array();
  json items = r.Json().value("items", json::array());
  std::sort(items.begin(), items.end(), [](const json& a, const json& b) {
    return a["metadata"]["name"] < b["metadata"]["name"];
  });
  return items;
}

json OperatorHarness::Pod(const std::string& name) {
  auto r = Api("GET", "/api/v1/namespaces/" + ns_ + "/pods/" + name);
  return r.code == 200 ? r.Json() : json();
}

bool OperatorHarness::HasService(const std::string& name) {
  return Api("GET", "/api/v1/namespaces/" + ns_ + "/services/" + name).code == 200;
}

std::vector<json> OperatorHarness::Events(const std::string& job) {
  auto r = Api("GET", "/api/v1/namespaces/" + ns_ + "/events");
  std::vector<json> out;
  if (r.code != 200) return out;
  for (const auto& e : r.Json().value("items", json::array())) {
    if (e["involvedObject"].value("name", "") == job) out.push_back(e);
  }
  return out;
}

void OperatorHarness::SucceedPod(const std::string& pod, const std::string& ns) {
  json patch = {
      {"status",
       {{"phase", "Succeeded"},
        {"containerStatuses",
         json::array(
             {{{"name", "trainer"},
               {"ready", false},
               {"state",
                {{"terminated",
                  {{"exitCode", 0}, {"reason", "Completed"}, {"finishedAt", Now()}}}}}}})}}}};
  auto r = Api("PATCH", "/api/v1/namespaces/" + Ns(ns) + "/pods/" + pod + "/status", patch.dump(),
               "application/merge-patch+json");
  if (r.code != 200) ADD_FAILURE_AT(__FILE__, __LINE__) << "patch " << pod << ": " << r.body;
}

void OperatorHarness::FailPod(const std::string& pod, int exit_code, const std::string& reason,
                              const std::string& message) {
  json terminated = {{"exitCode", exit_code}, {"reason", reason}, {"finishedAt", Now()}};
  if (exit_code > 128) terminated["signal"] = exit_code - 128;
  if (!message.empty()) terminated["message"] = message;
  json patch = {
      {"status",
       {{"phase", "Failed"},
        {"containerStatuses", json::array({{{"name", "trainer"},
                                            {"ready", false},
                                            {"state", {{"terminated", terminated}}}}})}}}};
  auto r = Api("PATCH", "/api/v1/namespaces/" + ns_ + "/pods/" + pod + "/status", patch.dump(),
               "application/merge-patch+json");
  if (r.code != 200) ADD_FAILURE_AT(__FILE__, __LINE__) << "patch " << pod << ": " << r.body;
}

bool OperatorHarness::WaitFor(const std::function<bool()>& condition, milliseconds timeout) {
  return spawnpoint::testing::WaitUntil(condition, timeout);
}

std::string OperatorHarness::Phase(const std::string& job, const std::string& ns) {
  return JsonField(Job(job, Ns(ns)), "/status/phase");
}

bool OperatorHarness::WaitPhase(const std::string& job, const std::string& phase,
                                milliseconds timeout, const std::string& ns) {
  return WaitFor([&] { return Phase(job, ns) == phase; }, timeout);
}

int FreePort() { return spawnpoint::testing::FreePort(2); }

}  // namespace spawnpoint::op::testing
