// The Kubernetes API test server: HTTP routing of the REST API (discovery, OpenAPI, CRUD,
// status subresources, watch, Table output, pods/log, pods/binding) on top of the Store,
// fault injection, the request log, the test-only endpoints under /testing/, and the
// optional simulated nodes. `kube-test-server` (main.cc) is a thin command line around it;
// unit tests may also run it in-process.
//
// Authentication and authorization (see auth.h and rbac.h): bearer tokens identify the
// admin (system:masters) or a service account, a request without one is what NoTokenMode
// says; Impersonate-User/-Group/-Uid headers switch the identity. With
// AuthorizationMode::kAlwaysAllow (the default) every request is served, whatever its
// token. With kRbac an unknown, expired or revoked token is 401 Unauthorized, every
// request is authorized against the stored Roles, ClusterRoles and their bindings (403
// Forbidden with the real message otherwise, before any fault or streaming), and the
// default cluster-admin, system:discovery, system:public-info-viewer and
// system:basic-user ClusterRoles and bindings are created at start. Also served:
// serviceaccounts/token (TokenRequest), selfsubjectaccessreviews, subjectaccessreviews,
// selfsubjectrulesreviews (authorization.k8s.io/v1), selfsubjectreviews and tokenreviews
// (authentication.k8s.io), JSON or protobuf bodies.
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
//                                        name, code, fault, userAgent, durationMs, user,
//                                        allowed, reason}]}
//   DELETE /testing/requests            clears the log
//   POST   /testing/compact             drops the retained watch events: older
//                                        resourceVersions and continue tokens become 410;
//                                        answers {"resourceVersion":"N"}
//   GET    /testing/info                {"resourceVersion", "watchWindow", "simulatedNodes",
//                                        "runPods", "bookmarkIntervalMs", "authorization",
//                                        "noToken"}
//   POST   /testing/serviceaccount-token  body {"namespace", "name", "expirationSeconds"?}:
//                                        {"token", "user", "kubeconfig"} for an existing
//                                        ServiceAccount (404 Status otherwise); the token
//                                        never expires unless expirationSeconds is given
// /testing/ requests are not recorded in the request log, never get faults and need no
// token.
//
// Thread-safety: Start/Stop from one owner thread; requests are served concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/apiserver/auth.h"
#include "tests/apiserver/faults.h"
#include "tests/apiserver/http_server.h"
#include "tests/apiserver/rbac.h"
#include "tests/apiserver/resources.h"
#include "tests/apiserver/store.h"

namespace spawnpoint::kubetest {

class NodeSimulator;

enum class AuthorizationMode { kAlwaysAllow, kRbac };
// Who a request without an Authorization header is. kubectl (client-go) never sends a
// token over plain http, only Impersonate-* headers, so the default makes credential-less
// requests the superuser, like kube-apiserver's former insecure port (user
// "system:unsecured", group system:masters); kubectl then acts as someone else with
// --as / a kubeconfig `as:`. kAnonymous is --anonymous-auth=true (system:anonymous,
// authorized by RBAC); kReject is --anonymous-auth=false (401).
enum class NoTokenMode { kAdmin, kAnonymous, kReject };

struct ServerOptions {
  int port = 0;
  size_t watch_window = 10000;
  std::chrono::milliseconds bookmark_interval{5000};
  bool verbose = false;
  bool aggregated_discovery = true;  // false: only the legacy discovery documents
  int simulate_nodes = 0;
  bool run_pods = false;
  std::string pod_work_root;  // per-pod temp dirs (logs, termination messages); "" = $TMPDIR
  AuthorizationMode authorization = AuthorizationMode::kAlwaysAllow;
  NoTokenMode no_token = NoTokenMode::kAdmin;
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
  Tokens& tokens() { return tokens_; }
  int port() const { return port_; }

  // Issues a token for an existing ServiceAccount (NotFound otherwise); `expiration` 0
  // never expires; empty `audiences` means the API server's.
  StatusOr<std::string> IssueServiceAccountToken(const std::string& ns, const std::string& name,
                                                 std::chrono::seconds expiration,
                                                 std::vector<std::string> audiences = {});

 private:
  struct RequestInfo;
  struct Authentication {
    bool ok = false;
    UserInfo user;
    std::string error;
  };
  static RequestInfo ParseRequestInfo(const HttpRequest& req);
  void Handle(const HttpRequest& req, HttpResponder& resp);
  void HandleTesting(const HttpRequest& req, HttpResponder& resp);
  // Identifies a bearer token; the anonymous user when it fails.
  Authentication Authenticate(const std::string& token);
  // A request without an Authorization header (see NoTokenMode).
  Authentication NoToken() const;
  // Applies Impersonate-* headers; false when it answered instead (403: not allowed to
  // impersonate; 500: groups or uid without a user, as upstream).
  bool Impersonate(const HttpRequest& req, UserInfo* user, HttpResponder& resp, RequestRecord& rec);
  Decision Decide(const Attributes& attributes);
  // TokenRequest and the review APIs, which have no storage. ServeAuthApi throws ApiError.
  bool IsAuthApi(const RequestInfo& ri) const;
  void ServeAuthApi(const HttpRequest& req, HttpResponder& resp, const RequestInfo& ri,
                    RequestRecord& rec);
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
  Tokens tokens_;
  std::unique_ptr<RbacObjects> rbac_objects_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<NodeSimulator> nodes_;
  std::atomic<bool> stopping_{false};
  int port_ = 0;
};

// The kubeconfig text for a server on 127.0.0.1:port (bearer token, context, namespace
// default): the admin's, or one for another user and token with its default namespace.
// A non-empty `as` adds `as:` (Impersonate-User): kubectl sends no token over plain http,
// only that header, so such a kubeconfig makes kubectl act as `as` too (its request comes
// without a token, as the superuser of NoTokenMode::kAdmin, which may impersonate anyone),
// while clients that send the token over http and ignore `as` (the operator's) are the
// token's user.
std::string KubeconfigFor(int port);
std::string KubeconfigFor(int port, const std::string& user, const std::string& token,
                          const std::string& ns, const std::string& as = "");

}  // namespace spawnpoint::kubetest
