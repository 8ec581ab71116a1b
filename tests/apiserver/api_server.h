// The Kubernetes API test server: HTTP routing of the REST API (discovery, OpenAPI, CRUD,
// status subresources, watch, Table output, pods/log, pods/binding) on top of the Store,
// fault injection, the request log, the test-only endpoints under /testing/, and the
// optional simulated nodes. `kube-test-server` (main.cc) is a thin command line around it;
// unit tests may also run it in-process.
//
// Test-only endpoints (JSON in and out):
//   GET    /testing/faults              {"rules":[{id, verb, resource, namespace, name, code,
//                                        retryAfter, latencyMs, cutAfterEvents, midLine,
//                                        count, rate, fired}]}
//   POST   /testing/faults              adds rules (body: JSON {"rules":[...]} or the compact
//                                        form, see faults.h); answers the rule set, or 400
//   DELETE /testing/faults              removes every rule
//   GET    /testing/requests?since=SEQ  {"requests":[{seq, time, method, verb, path, query,
//                                        group, version, resource, subresource, namespace,
//                                        name, code, fault, userAgent, durationMs}]}
//   DELETE /testing/requests            clears the log
//   POST   /testing/compact             drops the retained watch events: older
//                                        resourceVersions and continue tokens become 410;
//                                        answers {"resourceVersion":"N"}
//   GET    /testing/info                {"resourceVersion", "watchWindow", "simulatedNodes",
//                                        "runPods", "bookmarkIntervalMs"}
// /testing/ requests are not recorded in the request log and never get faults.
//
// Thread-safety: Start/Stop from one owner thread; requests are served concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "tests/apiserver/faults.h"
#include "tests/apiserver/http_server.h"
#include "tests/apiserver/resources.h"
#include "tests/apiserver/store.h"

namespace spawnpoint::kubetest {

class NodeSimulator;

struct ServerOptions {
  int port = 0;
  size_t watch_window = 10000;
  std::chrono::milliseconds bookmark_interval{5000};
  bool verbose = false;
  bool aggregated_discovery = true;  // false: only the legacy discovery documents
  int simulate_nodes = 0;
  bool run_pods = false;
  std::string pod_work_root;  // per-pod temp dirs (logs, termination messages); "" = $TMPDIR
};

class ApiServer {
 public:
  explicit ApiServer(ServerOptions options);
  ~ApiServer();

  // Starts listening on 127.0.0.1 and returns the port; starts the node simulator.
  StatusOr<int> Start();
  // Ends watches, stops the pods' processes and the listener. Idempotent.
  void Stop();

  Store& store() { return store_; }
  Registry& registry() { return registry_; }
  Faults& faults() { return faults_; }
  int port() const { return port_; }

 private:
  struct RequestInfo;
  void Handle(const HttpRequest& req, HttpResponder& resp);
  void HandleTesting(const HttpRequest& req, HttpResponder& resp);
  bool HandleNonResource(const HttpRequest& req, HttpResponder& resp);
  void HandleResource(const HttpRequest& req, HttpResponder& resp, RequestInfo& ri,
                      RequestRecord& rec);
  void ServeWatch(const HttpRequest& req, HttpResponder& resp, const RequestInfo& ri,
                  const ResourceInfo& info, const FaultDecision& fault);
  void SendJson(HttpResponder& resp, int code, const json& body, const HeaderList& headers = {},
                const std::string& content_type = "");
  void SendError(HttpResponder& resp, const ApiError& e, const HeaderList& headers = {});

  ServerOptions options_;
  Registry registry_;
  Store store_;
  Faults faults_;
  RequestLog requests_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<NodeSimulator> nodes_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
};

// The kubeconfig text for a server on 127.0.0.1:port (bearer token, context, namespace
// default).
std::string KubeconfigFor(int port);

}  // namespace spawnpoint::kubetest
