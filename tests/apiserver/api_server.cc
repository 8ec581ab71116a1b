#include "tests/apiserver/api_server.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "tests/apiserver/discovery.h"
#include "tests/apiserver/nodes.h"
#include "tests/apiserver/patch.h"
#include "tests/apiserver/table.h"
#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest {

struct ApiServer::RequestInfo {
  bool resource_request = false;
  std::string group;
  std::string version;
  std::string resource;
  std::string subresource;
  std::string ns;
  std::string name;
  std::string verb;
  bool watch_path = false;  // a legacy /watch/ path
  UserInfo user;            // who asks (after impersonation)

  // What the request log shows of it (the verb only for resource requests).
  void Record(RequestRecord& rec) const {
    if (resource_request) rec.verb = verb;
    rec.group = group;
    rec.version = version;
    rec.resource = resource;
    rec.subresource = subresource;
    rec.ns = ns;
    rec.name = name;
  }
};

namespace {

constexpr const char* kJson = "application/json";
constexpr int kAlreadyLogged = -1;
constexpr const char* kTableContentType = "application/json;as=Table;v=v1;g=meta.k8s.io";

bool WantsTable(const HttpRequest& req) {
  return req.Header("accept").find("as=Table") != std::string::npos;
}

IncludeObject IncludeFrom(const HttpRequest& req) {
  std::string v = req.Query("includeObject");
  if (v == "None") return IncludeObject::kNone;
  if (v == "Object") return IncludeObject::kObject;
  return IncludeObject::kMetadata;
}

FieldValidation ValidationFrom(const HttpRequest& req) {
  std::string v = req.Query("fieldValidation");
  if (v == "Strict") return FieldValidation::kStrict;
  if (v == "Ignore") return FieldValidation::kIgnore;
  if (v.empty() || v == "Warn") return FieldValidation::kWarn;
  throw BadRequestError("fieldValidation must be one of Ignore, Warn, Strict; got \"" + v + "\"");
}

std::string Elapsed(std::chrono::steady_clock::time_point start, double* ms) {
  *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f", *ms);
  return buf;
}

json ParseBody(const HttpRequest& req) {
  std::string ct = req.Header("content-type");
  if (ct.find("protobuf") != std::string::npos || ct.find("cbor") != std::string::npos) {
    throw ApiError(415, "UnsupportedMediaType",
                   "the body of the request was in an unknown format - accepted media types "
                   "include: application/json, application/yaml");
  }
  if (req.body.empty()) throw BadRequestError("the request body is empty");
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) {
    throw BadRequestError(
        "couldn't get version/kind; json parse error: the body is not valid JSON");
  }
  return body;
}

HeaderList WarningHeaders(const std::vector<std::string>& warnings) {
  HeaderList h;
  for (const auto& w : warnings) h.push_back({"Warning", "299 - " + json(w).dump()});
  return h;
}

std::string FormatLog(const RequestRecord& r, const std::string& ms) {
  std::string line = "level=info msg=request method=" + r.method + " path=" + r.path;
  if (!r.query.empty()) line += " query=" + json(r.query).dump();
  if (!r.verb.empty()) line += " verb=" + r.verb;
  if (r.code >= 0) line += " code=" + std::to_string(r.code);
  line += " user=" + json(r.user).dump() + " allowed=" + (r.allowed ? "true" : "false");
  line += " ms=" + ms;
  if (!r.fault.empty()) line += " fault=" + r.fault;
  return line;
}

const char* kRbacGroup = "rbac.authorization.k8s.io";

// The RBAC objects as the authorizer sees them: straight from the store.
class StoreRbacObjects : public RbacObjects {
 public:
  StoreRbacObjects(Store* store, Registry* registry) : store_(store), registry_(registry) {}

  std::vector<json> ClusterRoleBindings() const override { return List("clusterrolebindings", ""); }
  std::vector<json> RoleBindings(const std::string& ns) const override {
    return List("rolebindings", ns);
  }
  std::vector<json> ClusterRoles() const override { return List("clusterroles", ""); }
  std::optional<json> ClusterRole(const std::string& name) const override {
    return Get("clusterroles", "", name);
  }
  std::optional<json> Role(const std::string& ns, const std::string& name) const override {
    return Get("roles", ns, name);
  }

 private:
  std::vector<json> List(const std::string& plural, const std::string& ns) const {
    auto info = registry_->FindAnyVersion(kRbacGroup, plural);
    if (!info) return {};
    try {
      return store_->List(*info, ns, ListOptions{}).items;
    } catch (const ApiError&) {
      return {};
    }
  }
  std::optional<json> Get(const std::string& plural, const std::string& ns,
                          const std::string& name) const {
    auto info = registry_->FindAnyVersion(kRbacGroup, plural);
    if (!info) return std::nullopt;
    try {
      return store_->Get(*info, ns, name);
    } catch (const ApiError&) {
      return std::nullopt;
    }
  }

  Store* store_;
  Registry* registry_;
};

}  // namespace

// The routing view of a request path: /api/v1/..., /apis/<group>/<version>/...
ApiServer::RequestInfo ApiServer::ParseRequestInfo(const HttpRequest& req) {
  RequestInfo ri;
  auto parts = SplitPath(req.path);
  size_t i = 0;
  if (parts.size() >= 2 && parts[0] == "api") {
    ri.version = parts[1];
    i = 2;
  } else if (parts.size() >= 3 && parts[0] == "apis") {
    ri.group = parts[1];
    ri.version = parts[2];
    i = 3;
  }
  if (i > 0 && i < parts.size()) {
    ri.resource_request = true;
    if (parts[i] == "watch") {
      ri.watch_path = true;
      ++i;
    }
    std::vector<std::string> rest(parts.begin() + static_cast<long>(i), parts.end());
    // namespaces/<ns>/status and /finalize are subresources of the namespace itself.
    bool namespace_subresource = rest.size() == 3 && (rest[2] == "status" || rest[2] == "finalize");
    if (rest.size() >= 3 && rest[0] == "namespaces" && !namespace_subresource) {
      ri.ns = rest[1];
      rest.erase(rest.begin(), rest.begin() + 2);
    }
    if (!rest.empty()) ri.resource = rest[0];
    if (rest.size() >= 2) ri.name = rest[1];
    if (rest.size() >= 3) ri.subresource = rest[2];
    if (rest.size() > 3 || ri.resource.empty()) ri.resource_request = false;
  }
  const std::string& m = req.method;
  bool watch = ri.watch_path || TrueParam(req.Query("watch"));
  if (m == "GET") {
    ri.verb = watch ? "watch" : (ri.name.empty() ? "list" : "get");
  } else if (m == "POST") {
    ri.verb = "create";
  } else if (m == "PUT") {
    ri.verb = "update";
  } else if (m == "PATCH") {
    ri.verb = "patch";
  } else if (m == "DELETE") {
    ri.verb = ri.name.empty() ? "deletecollection" : "delete";
  }
  return ri;
}

namespace {

// Header values repeated in a request are joined by "\n" (see http_server.cc).
std::vector<std::string> HeaderValues(const HttpRequest& req, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(req.Header(name));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

json StatusForReview(const Decision& d) {
  json st = {{"allowed", d.allowed}};
  if (!d.reason.empty()) st["reason"] = d.reason;
  return st;
}

}  // namespace

ApiServer::ApiServer(ServerOptions options)
    : options_(options), store_(&registry_, Store::Options{options.watch_window}) {
  rbac_objects_ = std::make_unique<StoreRbacObjects>(&store_, &registry_);
}

ApiServer::~ApiServer() { Stop(); }

StatusOr<int> ApiServer::Start() {
  http_ = std::make_unique<HttpServer>(
      [this](const HttpRequest& req, HttpResponder& resp) { Handle(req, resp); });
  auto port = http_->Start(options_.port);
  if (!port.ok()) return port.status();
  port_ = *port;
  if (options_.authorization == AuthorizationMode::kRbac) {
    // The defaults every cluster has (reconciled at start, like the real server).
    auto roles = registry_.FindAnyVersion(kRbacGroup, "clusterroles");
    auto bindings = registry_.FindAnyVersion(kRbacGroup, "clusterrolebindings");
    try {
      for (auto& r : BootstrapClusterRoles()) store_.Create(*roles, "", r, {});
      for (auto& b : BootstrapClusterRoleBindings()) store_.Create(*bindings, "", b, {});
    } catch (const ApiError& e) {
      return Internal("creating the default RBAC objects: " + std::string(e.what()));
    }
  }
  if (options_.simulate_nodes > 0) {
    NodeSimulator::Options nopts;
    nopts.nodes = options_.simulate_nodes;
    nopts.run_pods = options_.run_pods;
    nopts.work_root = options_.pod_work_root;
    nopts.api_port = port_;
    nodes_ = std::make_unique<NodeSimulator>(&store_, nopts);
    SP_RETURN_IF_ERROR(nodes_->Start());
  }
  return port_;
}

void ApiServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (nodes_) nodes_->Stop();
  store_.StopAllWatchers();
  if (http_) http_->Stop();
}

void ApiServer::SendJson(HttpResponder& resp, int code, const json& body, const HeaderList& headers,
                         const std::string& content_type) {
  resp.Send(code, content_type.empty() ? kJson : content_type, body.dump() + "\n", headers);
}

void ApiServer::SendError(HttpResponder& resp, const ApiError& e, const HeaderList& headers) {
  HeaderList h = headers;
  if (e.code() == 429 && e.details().contains("retryAfterSeconds")) {
    h.push_back({"Retry-After", std::to_string(e.details()["retryAfterSeconds"].get<int>())});
  }
  SendJson(resp, e.code(), e.ToStatus(), h);
}

void ApiServer::Handle(const HttpRequest& req, HttpResponder& resp) {
  auto start = std::chrono::steady_clock::now();
  if (req.path.rfind("/testing/", 0) == 0) {
    HandleTesting(req, resp);
    return;
  }
  RequestRecord rec;
  rec.method = req.method;
  rec.path = req.path;
  rec.query = req.raw_query;
  rec.user_agent = req.Header("user-agent");
  {
    char buf[64];
    auto now = std::chrono::system_clock::now();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
    std::string ts = FormatTimestamp(now);
    snprintf(buf, sizeof(buf), "%s.%03dZ", ts.substr(0, ts.size() - 1).c_str(),
             static_cast<int>(ms.count()));
    rec.time = buf;
  }
  RequestInfo ri = ParseRequestInfo(req);
  bool served_non_resource = false;  // by HandleNonResource: logged without request info
  const std::string authorization = req.Header("authorization");
  Authentication auth =
      authorization.empty() ? NoToken() : Authenticate(BearerToken(authorization));
  if (!auth.ok && options_.authorization == AuthorizationMode::kRbac) {
    rec.reason = auth.error;
    rec.code = 401;
    SendError(resp, ApiError(401, "Unauthorized", "Unauthorized"));
  } else if (!Impersonate(req, &auth.user, resp, rec)) {
    rec.user = auth.user.name;
    rec.code = resp.code();
  } else {
    ri.user = auth.user;
    rec.user = ri.user.name;
    Attributes attrs = RequestAttributes(req.method, req.path, req.query);
    attrs.user = ri.user;
    Decision decision = Decide(attrs);
    rec.allowed = decision.allowed;
    rec.reason = decision.reason;
    if (!decision.allowed) {
      rec.code = 403;
      SendError(resp, AuthorizationForbiddenError(attrs, decision.reason));
    } else if (!HandleNonResource(req, resp)) {
      // /api/v1/... or /apis/<group>/<version>/...
      if (!ri.resource_request) {
        rec.code = 404;
        resp.Send(404, "text/plain; charset=utf-8", "404 page not found\n");
      } else {
        HandleResource(req, resp, ri, rec);
      }
    } else {
      served_non_resource = true;
      rec.code = resp.code();
    }
  }
  if (!served_non_resource) ri.Record(rec);
  std::string ms = Elapsed(start, &rec.duration_ms);
  if (rec.code == kAlreadyLogged) {
    if (options_.verbose) std::cerr << FormatLog(rec, ms) << " stream=end" << std::endl;
    return;
  }
  if (rec.code == 0) rec.code = resp.code();
  if (options_.verbose) std::cerr << FormatLog(rec, ms) << std::endl;
  requests_.Add(std::move(rec));
}

ApiServer::Authentication ApiServer::NoToken() const {
  Authentication a;
  a.ok = options_.no_token != NoTokenMode::kReject;
  if (options_.no_token == NoTokenMode::kAdmin) {
    a.user.name = "system:unsecured";
    a.user.groups = {kSystemMasters, kAllAuthenticated};
  } else {
    a.user.name = kAnonymousUser;
    a.user.groups = {kAllUnauthenticated};
    if (!a.ok) a.error = "no bearer token";
  }
  return a;
}

ApiServer::Authentication ApiServer::Authenticate(const std::string& token) {
  Authentication a;
  auto lookup = tokens_.Find(token, std::chrono::system_clock::now());
  if (lookup.kind == Tokens::Kind::kAdmin) {
    a.ok = true;
    a.user = AdminUser();
    return a;
  }
  if (lookup.kind == Tokens::Kind::kServiceAccount) {
    // Like the real token authenticator: the service account must still exist.
    auto info = registry_.FindAnyVersion("", "serviceaccounts");
    try {
      json sa = store_.Get(*info, lookup.sa.ns, lookup.sa.name);
      std::string uid = sa["metadata"].value("uid", "");
      if (uid == lookup.sa.uid) {
        a.ok = true;
        a.user = ServiceAccountUser(lookup.sa.ns, lookup.sa.name, uid);
        return a;
      }
      a.error = "service account " + lookup.sa.ns + "/" + lookup.sa.name +
                " has been deleted and recreated";
    } catch (const ApiError&) {
      a.error = "service account " + lookup.sa.ns + "/" + lookup.sa.name + " has been deleted";
    }
  } else {
    a.error = lookup.error;
  }
  a.user.name = kAnonymousUser;
  a.user.groups = {kAllUnauthenticated};
  return a;
}

bool ApiServer::Impersonate(const HttpRequest& req, UserInfo* user, HttpResponder& resp,
                            RequestRecord& rec) {
  std::string as_user = req.Header("impersonate-user");
  std::vector<std::string> groups = HeaderValues(req, "impersonate-group");
  std::string uid = req.Header("impersonate-uid");
  if (as_user.empty()) {
    if (groups.empty() && uid.empty()) return true;
    rec.reason = "impersonation without Impersonate-User";
    resp.Send(500, "text/plain; charset=utf-8",
              "Internal Server Error: " + json(req.target).dump() +
                  ": requested impersonation of groups or uid without impersonating a user\n");
    return false;
  }
  // Each impersonated value needs the "impersonate" verb on it, checked as the requestor.
  std::vector<Attributes> checks;
  Attributes base;
  base.user = *user;
  base.verb = "impersonate";
  base.resource_request = true;
  std::string sa_ns, sa_name;
  bool is_sa = ParseServiceAccountUser(as_user, &sa_ns, &sa_name);
  Attributes u = base;
  if (is_sa) {
    u.resource = "serviceaccounts";
    u.ns = sa_ns;
    u.name = sa_name;
  } else {
    u.resource = "users";
    u.name = as_user;
  }
  checks.push_back(u);
  for (const auto& g : groups) {
    Attributes a = base;
    a.resource = "groups";
    a.name = g;
    checks.push_back(a);
  }
  if (!uid.empty()) {
    Attributes a = base;
    a.api_group = "authentication.k8s.io";
    a.resource = "uids";
    a.name = uid;
    checks.push_back(a);
  }
  for (const auto& check : checks) {
    Decision d = Decide(check);
    if (!d.allowed) {
      rec.reason = d.reason;
      SendError(resp, AuthorizationForbiddenError(check, d.reason));
      return false;
    }
  }
  UserInfo next;
  next.name = as_user;
  next.uid = uid;
  if (!groups.empty()) {
    next.groups = groups;
  } else if (is_sa) {
    next.groups = ServiceAccountUser(sa_ns, sa_name).groups;
  }
  bool has_auth = next.InGroup(kAllAuthenticated), has_unauth = next.InGroup(kAllUnauthenticated);
  if (as_user == kAnonymousUser) {
    if (!has_unauth) next.groups.push_back(kAllUnauthenticated);
  } else if (!has_auth && !has_unauth) {
    next.groups.push_back(kAllAuthenticated);
  }
  *user = std::move(next);
  return true;
}

Decision ApiServer::Decide(const Attributes& attributes) {
  if (options_.authorization != AuthorizationMode::kRbac) return {true, ""};
  return Authorize(*rbac_objects_, attributes);
}

StatusOr<std::string> ApiServer::IssueServiceAccountToken(const std::string& ns,
                                                          const std::string& name,
                                                          std::chrono::seconds expiration,
                                                          std::vector<std::string> audiences) {
  auto info = registry_.FindAnyVersion("", "serviceaccounts");
  try {
    json sa = store_.Get(*info, ns, name);
    return tokens_.Issue(ns, name, sa["metadata"].value("uid", ""), expiration,
                         std::move(audiences));
  } catch (const ApiError& e) {
    return Status(StatusCode::kNotFound, e.message());
  }
}

bool ApiServer::HandleNonResource(const HttpRequest& req, HttpResponder& resp) {
  const std::string& p = req.path;
  std::string accept = req.Header("accept");
  bool aggregated = options_.aggregated_discovery &&
                    accept.find("as=APIGroupDiscoveryList") != std::string::npos &&
                    accept.find("v=v2") != std::string::npos;
  const std::string aggregated_type =
      "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
  if (req.method != "GET" && (p == "/version" || p == "/api" || p == "/apis" ||
                              p.rfind("/openapi", 0) == 0 || p == "/healthz")) {
    SendJson(resp, 405,
             ApiError(405, "MethodNotAllowed",
                      "the server does not allow this method "
                      "on the requested resource")
                 .ToStatus());
    return true;
  }
  if (p == "/version" || p == "/version/") {
    SendJson(resp, 200, VersionDocument());
  } else if (p == "/healthz" || p == "/livez" || p == "/readyz") {
    resp.Send(200, "text/plain; charset=utf-8", "ok");
  } else if (p == "/api" || p == "/api/") {
    if (aggregated) {
      SendJson(resp, 200, AggregatedDiscovery(registry_, true), {}, aggregated_type);
    } else {
      SendJson(resp, 200, CoreApiVersions("127.0.0.1:" + std::to_string(port_)));
    }
  } else if (p == "/apis" || p == "/apis/") {
    if (aggregated) {
      SendJson(resp, 200, AggregatedDiscovery(registry_, false), {}, aggregated_type);
    } else {
      SendJson(resp, 200, ApiGroupList(registry_));
    }
  } else if (p == "/openapi/v3" || p == "/openapi/v3/") {
    SendJson(resp, 200, OpenApiV3Root(registry_));
  } else if (p.rfind("/openapi/v3/", 0) == 0) {
    auto doc = OpenApiV3GroupVersion(registry_, p.substr(std::string("/openapi/v3/").size()));
    if (!doc) {
      resp.Send(404, "text/plain; charset=utf-8", "404 page not found\n");
    } else {
      SendJson(resp, 200, *doc);
    }
  } else if (p == "/openapi/v2") {
    // kubectl asks for the protobuf form first; it gets JSON only when it accepts JSON.
    if (accept.find("protobuf") != std::string::npos && accept.find("json") == std::string::npos) {
      resp.Send(406, "text/plain; charset=utf-8",
                "only application/json is served for /openapi/v2\n");
    } else {
      SendJson(resp, 200, OpenApiV2(registry_));
    }
  } else {
    // /api/v1 and /apis/<g>[/<v>] discovery documents.
    auto parts = SplitPath(p);
    if (parts.size() == 2 && parts[0] == "api") {
      auto list = ApiResourceList(registry_, "", parts[1]);
      if (!list) return false;
      SendJson(resp, 200, *list);
    } else if (parts.size() == 2 && parts[0] == "apis") {
      auto group = ApiGroup(registry_, parts[1]);
      if (!group) {
        resp.Send(404, "text/plain; charset=utf-8", "404 page not found\n");
      } else {
        SendJson(resp, 200, *group);
      }
    } else if (parts.size() == 3 && parts[0] == "apis") {
      auto list = ApiResourceList(registry_, parts[1], parts[2]);
      if (!list) {
        resp.Send(404, "text/plain; charset=utf-8", "404 page not found\n");
      } else {
        SendJson(resp, 200, *list);
      }
    } else {
      return false;
    }
  }
  return true;
}

void ApiServer::HandleTesting(const HttpRequest& req, HttpResponder& resp) {
  const std::string& p = req.path;
  if (p == "/testing/faults") {
    if (req.method == "GET") {
      SendJson(resp, 200, faults_.ToJson());
    } else if (req.method == "POST" || req.method == "PUT") {
      if (req.method == "PUT") faults_.Clear();
      Status st = faults_.Add(req.body);
      if (!st.ok()) {
        SendJson(resp, 400, BadRequestError(st.message()).ToStatus());
      } else {
        SendJson(resp, 200, faults_.ToJson());
      }
    } else if (req.method == "DELETE") {
      faults_.Clear();
      SendJson(resp, 200, faults_.ToJson());
    } else {
      resp.Send(405, "text/plain", "method not allowed\n");
    }
  } else if (p == "/testing/requests") {
    if (req.method == "GET") {
      uint64_t since =
          req.HasQuery("since") ? std::strtoull(req.Query("since").c_str(), nullptr, 10) : 0;
      SendJson(resp, 200, requests_.ToJson(since));
    } else if (req.method == "DELETE") {
      requests_.Clear();
      SendJson(resp, 200, requests_.ToJson(0));
    } else {
      resp.Send(405, "text/plain", "method not allowed\n");
    }
  } else if (p == "/testing/compact" && req.method == "POST") {
    store_.Compact();
    SendJson(resp, 200, {{"resourceVersion", std::to_string(store_.CurrentResourceVersion())}});
  } else if (p == "/testing/info" && req.method == "GET") {
    SendJson(resp, 200,
             {{"resourceVersion", std::to_string(store_.CurrentResourceVersion())},
              {"watchWindow", options_.watch_window},
              {"simulatedNodes", options_.simulate_nodes},
              {"runPods", options_.run_pods},
              {"bookmarkIntervalMs", options_.bookmark_interval.count()},
              {"authorization",
               options_.authorization == AuthorizationMode::kRbac ? "rbac" : "always-allow"},
              {"noToken", options_.no_token == NoTokenMode::kAdmin       ? "admin"
                          : options_.no_token == NoTokenMode::kAnonymous ? "anonymous"
                                                                         : "reject"}});
  } else if (p == "/testing/serviceaccount-token" && req.method == "POST") {
    json body = json::parse(req.body, nullptr, false);
    std::string ns = body.is_object() ? body.value("namespace", "") : "";
    std::string name = body.is_object() ? body.value("name", "") : "";
    if (ns.empty() || name.empty() ||
        (body.contains("expirationSeconds") && !body["expirationSeconds"].is_number_integer())) {
      SendJson(resp, 400,
               BadRequestError("the body must be {\"namespace\": ..., \"name\": ..., "
                               "\"expirationSeconds\": N (optional)}")
                   .ToStatus());
      return;
    }
    auto token = IssueServiceAccountToken(
        ns, name, std::chrono::seconds(body.value("expirationSeconds", int64_t{0})));
    if (!token.ok()) {
      SendJson(resp, 404, NotFoundError("", "serviceaccounts", name).ToStatus());
      return;
    }
    std::string user = ServiceAccountUserName(ns, name);
    SendJson(resp, 200,
             {{"token", *token},
              {"user", user},
              {"kubeconfig", KubeconfigFor(port_, user, *token, ns, user)}});
  } else {
    resp.Send(404, "text/plain; charset=utf-8", "404 page not found\n");
  }
}

void ApiServer::HandleResource(const HttpRequest& req, HttpResponder& resp, RequestInfo& ri,
                               RequestRecord& rec) {
  auto info_opt = registry_.Find(ri.group, ri.version, ri.resource);
  bool auth_api = IsAuthApi(ri);
  if ((!info_opt && !auth_api) || ri.verb.empty()) {
    ApiError e(404, "NotFound", "the server could not find the requested resource",
               json{{"group", ri.group}, {"kind", ri.resource}});
    SendError(resp, e);
    rec.code = 404;
    return;
  }
  std::string fault_resource =
      ri.subresource.empty() ? ri.resource : ri.resource + "/" + ri.subresource;
  FaultDecision fault = faults_.Decide(ri.verb, fault_resource, ri.ns, ri.name);
  rec.fault = fault.Describe();
  if (fault.latency_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(fault.latency_ms));
  }
  try {
    if (fault.code != 0 && !(ri.verb == "watch" && fault.code == 410)) {
      switch (fault.code) {
        case 429:
          throw TooManyRequestsError(fault.retry_after);
        case 409:
          throw StaleConflictError(ri.group, ri.resource, ri.name);
        case 410:
          throw GoneError("the resource version requested is too old (injected)");
        case 500:
          throw InternalServerError("injected fault");
        default:
          throw ApiError(fault.code, fault.code == 503 ? "ServiceUnavailable" : "InternalError",
                         "injected fault: HTTP " + std::to_string(fault.code));
      }
    }
    if (auth_api) {
      ServeAuthApi(req, resp, ri, rec);
      return;
    }
    const ResourceInfo& info = *info_opt;
    if (!ri.subresource.empty()) {
      bool status_ok = ri.subresource == "status" && info.status_subresource;
      bool log_ok = ri.subresource == "log" && info.group.empty() && info.plural == "pods";
      bool binding_ok = ri.subresource == "binding" && info.group.empty() && info.plural == "pods";
      if (!status_ok && !log_ok && !binding_ok) {
        throw ApiError(404, "NotFound", "the server could not find the requested resource");
      }
      if ((log_ok && ri.verb != "get") || (binding_ok && ri.verb != "create") ||
          (status_ok && ri.verb != "get" && ri.verb != "update" && ri.verb != "patch")) {
        throw MethodNotSupportedError(info.group, info.plural + "/" + ri.subresource, ri.verb);
      }
    }
    if (info.namespaced && ri.ns.empty() && ri.verb != "list" && ri.verb != "watch") {
      throw ApiError(404, "NotFound", "the server could not find the requested resource");
    }
    if (!info.namespaced && !ri.ns.empty()) {
      throw ApiError(404, "NotFound", "the server could not find the requested resource");
    }
    WriteOptions wopts;
    std::vector<std::string> warnings;
    wopts.warnings = &warnings;
    wopts.dry_run = req.Query("dryRun") == "All";
    if (ri.verb == "create" || ri.verb == "update" || ri.verb == "patch") {
      wopts.field_validation = ValidationFrom(req);
    }
    ListOptions lopts;
    if (ri.verb == "list" || ri.verb == "watch" || ri.verb == "deletecollection") {
      lopts.labels = LabelSelector::Parse(req.Query("labelSelector"));
      lopts.fields = FieldSelector::Parse(req.Query("fieldSelector"), info.field_selectors);
      if (req.HasQuery("limit"))
        lopts.limit = std::strtoll(req.Query("limit").c_str(), nullptr, 10);
      lopts.continue_token = req.Query("continue");
    }

    if (ri.verb == "watch") {
      // A watch is logged when it starts, so tests can see it while it streams.
      rec.code = 200;
      RequestRecord started = rec;
      ri.Record(started);
      if (options_.verbose) std::cerr << FormatLog(started, "0") << " stream=start" << std::endl;
      requests_.Add(std::move(started));
      rec.code = kAlreadyLogged;
      ServeWatch(req, resp, ri, info, fault);
      return;
    }
    if (ri.verb == "get" && ri.subresource == "log") {
      std::string logs = nodes_ ? nodes_->Logs(ri.ns, ri.name) : "";
      store_.Get(info, ri.ns, ri.name);  // 404 for an unknown pod
      rec.code = 200;
      resp.Send(200, "text/plain", logs);
      return;
    }
    if (ri.verb == "get") {
      json obj = store_.Get(info, ri.ns, ri.name);
      rec.code = 200;
      if (WantsTable(req)) {
        SendJson(resp, 200,
                 BuildTable(info, {obj}, IncludeFrom(req), true,
                            obj["metadata"].value("resourceVersion", "")),
                 {}, kTableContentType);
      } else {
        SendJson(resp, 200, obj);
      }
      return;
    }
    if (ri.verb == "list") {
      ListResult lr = store_.List(info, ri.ns, lopts);
      rec.code = 200;
      if (WantsTable(req)) {
        SendJson(resp, 200,
                 BuildTable(info, lr.items, IncludeFrom(req), true, lr.resource_version,
                            lr.continue_token),
                 {}, kTableContentType);
        return;
      }
      json meta = {{"resourceVersion", lr.resource_version}};
      if (!lr.continue_token.empty()) meta["continue"] = lr.continue_token;
      if (lr.remaining_item_count) meta["remainingItemCount"] = *lr.remaining_item_count;
      SendJson(resp, 200,
               {{"kind", info.list_kind},
                {"apiVersion", info.api_version()},
                {"metadata", meta},
                {"items", lr.items}});
      return;
    }
    if (ri.verb == "create" && ri.subresource == "binding") {
      json body = ParseBody(req);
      std::string node = body.value("target", json::object()).value("name", "");
      if (node.empty()) {
        throw InvalidError("", "Binding", ri.name,
                           {{FieldError::Type::kRequired, "target.name", nullptr, ""}});
      }
      json pod = store_.Get(info, ri.ns, ri.name);
      if (!pod["spec"].value("nodeName", "").empty()) {
        throw ConflictError("", "pods", ri.name,
                            "pod " + ri.name + " is already assigned to node \"" +
                                pod["spec"].value("nodeName", "") + "\"");
      }
      store_.Mutate("", "pods", ri.ns, ri.name, [&](json& p) {
        p["spec"]["nodeName"] = node;
        return true;
      });
      rec.code = 201;
      SendJson(resp, 201,
               {{"kind", "Status"},
                {"apiVersion", "v1"},
                {"metadata", json::object()},
                {"status", "Success"},
                {"code", 201}});
      return;
    }
    if (ri.verb == "create") {
      json body = ParseBody(req);
      json created = store_.Create(info, ri.ns, std::move(body), wopts);
      rec.code = 201;
      SendJson(resp, 201, created, WarningHeaders(warnings));
      return;
    }
    if (ri.verb == "update") {
      json body = ParseBody(req);
      json updated = store_.Update(info, ri.ns, ri.name, ri.subresource, std::move(body), wopts);
      rec.code = 200;
      SendJson(resp, 200, updated, WarningHeaders(warnings));
      return;
    }
    if (ri.verb == "patch") {
      PatchType type = PatchTypeFromContentType(req.Header("content-type"));
      if (type == PatchType::kApply) {
        throw ApiError(415, "UnsupportedMediaType",
                       "server-side apply (application/apply-patch+yaml) is not supported by the "
                       "spawnpoint API test server; use client-side kubectl apply");
      }
      if (type == PatchType::kUnknown || (type == PatchType::kStrategic && info.custom)) {
        throw ApiError(
            415, "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types "
            "include: application/json-patch+json, application/merge-patch+json" +
                std::string(info.custom ? "" : ", application/strategic-merge-patch+json"));
      }
      json patch = ParseBody(req);
      wopts.is_patch = true;
      json patched = store_.Patch(
          info, ri.ns, ri.name, ri.subresource,
          [&](const json& current) {
            switch (type) {
              case PatchType::kMerge:
                return ApplyMergePatch(current, patch);
              case PatchType::kStrategic:
                return ApplyStrategicMergePatch(current, patch);
              default:
                return ApplyJsonPatch(current, patch);
            }
          },
          wopts);
      rec.code = 200;
      SendJson(resp, 200, patched, WarningHeaders(warnings));
      return;
    }
    if (ri.verb == "delete" || ri.verb == "deletecollection") {
      DeleteOptions dopts;
      json body = req.body.empty() ? json::object() : json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object())
        throw BadRequestError("invalid DeleteOptions body");
      dopts.propagation = body.value("propagationPolicy", req.Query("propagationPolicy"));
      if (body.value("orphanDependents", false) || req.Query("orphanDependents") == "true") {
        dopts.propagation = "Orphan";
      }
      if (body.contains("gracePeriodSeconds") && body["gracePeriodSeconds"].is_number_integer()) {
        dopts.grace_period_seconds = body["gracePeriodSeconds"].get<int64_t>();
      } else if (req.HasQuery("gracePeriodSeconds")) {
        dopts.grace_period_seconds =
            std::strtoll(req.Query("gracePeriodSeconds").c_str(), nullptr, 10);
      }
      json pre = body.value("preconditions", json::object());
      dopts.precondition_uid = pre.value("uid", "");
      dopts.precondition_resource_version = pre.value("resourceVersion", "");
      dopts.dry_run = wopts.dry_run || (body.contains("dryRun") && body["dryRun"].is_array() &&
                                        !body["dryRun"].empty());
      if (!dopts.propagation.empty() && dopts.propagation != "Orphan" &&
          dopts.propagation != "Background" && dopts.propagation != "Foreground") {
        throw BadRequestError("propagationPolicy: Unsupported value: \"" + dopts.propagation +
                              "\": supported values: \"Foreground\", \"Background\", \"Orphan\"");
      }
      if (ri.verb == "deletecollection") {
        auto items = store_.DeleteCollection(info, ri.ns, lopts, dopts);
        rec.code = 200;
        SendJson(
            resp, 200,
            {{"kind", info.list_kind},
             {"apiVersion", info.api_version()},
             {"metadata", {{"resourceVersion", std::to_string(store_.CurrentResourceVersion())}}},
             {"items", items}});
        return;
      }
      json deleted = store_.Delete(info, ri.ns, ri.name, dopts);
      // Still there at the time of the delete (finalizers, a pod shutting down): the real
      // server answers 202 with the object as it is then.
      bool pending = deleted["metadata"].contains("deletionTimestamp") && !dopts.dry_run;
      rec.code = pending ? 202 : 200;
      SendJson(resp, rec.code, deleted);
      return;
    }
    throw MethodNotSupportedError(info.group, info.plural, ri.verb);
  } catch (const ApiError& e) {
    rec.code = e.code();
    SendError(resp, e);
  }
}

bool ApiServer::IsAuthApi(const RequestInfo& ri) const {
  if (ri.group.empty()) {
    return ri.version == "v1" && ri.resource == "serviceaccounts" && ri.subresource == "token";
  }
  if (ri.group == "authorization.k8s.io") {
    return ri.version == "v1" &&
           (ri.resource == "selfsubjectaccessreviews" || ri.resource == "subjectaccessreviews" ||
            ri.resource == "selfsubjectrulesreviews");
  }
  if (ri.group == "authentication.k8s.io") {
    return ri.version == "v1" &&
           (ri.resource == "selfsubjectreviews" || ri.resource == "tokenreviews");
  }
  return false;
}

void ApiServer::ServeAuthApi(const HttpRequest& req, HttpResponder& resp, const RequestInfo& ri,
                             RequestRecord& rec) {
  const bool token_request = ri.resource == "serviceaccounts";
  if (ri.verb != "create") {
    throw MethodNotSupportedError(ri.group, token_request ? "serviceaccounts/token" : ri.resource,
                                  ri.verb);
  }
  if (token_request ? (ri.ns.empty() || ri.name.empty()) : (!ri.ns.empty() || !ri.name.empty())) {
    throw ApiError(404, "NotFound", "the server could not find the requested resource");
  }
  const std::string content_type = req.Header("content-type");
  auto decode = [&](ReviewKind kind) {
    auto body = DecodeReviewBody(kind, content_type, req.body);
    if (!body.ok()) throw BadRequestError(body.status().message());
    json spec = body->value("spec", json::object());
    return spec.is_object() ? spec : json::object();
  };
  auto reply = [&](const std::string& kind, json body) {
    body["kind"] = kind;
    body["apiVersion"] = ri.group + "/" + ri.version;
    if (!body.contains("metadata")) body["metadata"] = {{"creationTimestamp", nullptr}};
    rec.code = 201;
    SendJson(resp, 201, body);
  };
  const auto now = std::chrono::system_clock::now();

  if (token_request) {
    json spec = decode(ReviewKind::kTokenRequest);
    int64_t seconds = 3600;
    if (spec.contains("expirationSeconds") && spec["expirationSeconds"].is_number_integer()) {
      seconds = spec["expirationSeconds"].get<int64_t>();
    }
    if (seconds < 600 || seconds > (int64_t{1} << 32)) {
      throw InvalidError("authentication.k8s.io", "TokenRequest", ri.name,
                         {{FieldError::Type::kInvalid, "spec.expirationSeconds", seconds,
                           seconds < 600 ? "may not specify a duration less than 10 minutes"
                                         : "may not specify a duration larger than 2^32 seconds"}});
    }
    std::vector<std::string> audiences = Strings(spec, "audiences");
    if (audiences.empty()) audiences = {kApiAudience};
    auto token = IssueServiceAccountToken(ri.ns, ri.name, std::chrono::seconds(seconds), audiences);
    if (!token.ok()) throw NotFoundError("", "serviceaccounts", ri.name);
    rec.code = 201;
    SendJson(
        resp, 201,
        {{"kind", "TokenRequest"},
         {"apiVersion", "authentication.k8s.io/v1"},
         {"metadata",
          {{"name", ri.name}, {"namespace", ri.ns}, {"creationTimestamp", FormatTimestamp(now)}}},
         {"spec",
          {{"audiences", audiences},
           {"expirationSeconds", seconds},
           {"boundObjectRef", spec.value("boundObjectRef", json())}}},
         {"status",
          {{"token", *token},
           {"expirationTimestamp", FormatTimestamp(now + std::chrono::seconds(seconds))}}}});
    return;
  }

  if (ri.resource == "selfsubjectaccessreviews" || ri.resource == "subjectaccessreviews") {
    const bool self = ri.resource == "selfsubjectaccessreviews";
    const std::string kind = self ? "SelfSubjectAccessReview" : "SubjectAccessReview";
    json spec =
        decode(self ? ReviewKind::kSelfSubjectAccessReview : ReviewKind::kSubjectAccessReview);
    std::vector<FieldError> errors;
    auto attrs = AttributesFromReviewSpec(spec);
    if (!attrs.ok()) {
      bool both = spec.contains("resourceAttributes") && spec["resourceAttributes"].is_object();
      errors.push_back({FieldError::Type::kInvalid,
                        both ? "spec.nonResourceAttributes" : "spec.resourceAttributes",
                        both ? spec["nonResourceAttributes"] : json(), attrs.status().message()});
    }
    UserInfo user = ri.user;
    if (!self) {
      user = UserInfo{spec.value("user", ""), spec.value("uid", ""), Strings(spec, "groups")};
      if (user.name.empty() && user.groups.empty()) {
        errors.push_back({FieldError::Type::kInvalid, "spec.user", "",
                          "at least one of user or group must be specified"});
      }
    }
    if (!errors.empty()) throw InvalidError("authorization.k8s.io", kind, "", errors);
    Attributes a = *attrs;
    a.user = user;
    reply(kind, {{"spec", spec}, {"status", StatusForReview(Decide(a))}});
    return;
  }

  if (ri.resource == "selfsubjectrulesreviews") {
    json spec = decode(ReviewKind::kSelfSubjectRulesReview);
    json resource_rules = json::array(), non_resource_rules = json::array();
    std::vector<std::string> errors;
    auto add = [&](const PolicyRule& r) {
      if (!r.resources.empty()) {
        json j = {{"verbs", r.verbs}, {"apiGroups", r.api_groups}, {"resources", r.resources}};
        if (!r.resource_names.empty()) j["resourceNames"] = r.resource_names;
        resource_rules.push_back(j);
      }
      if (!r.non_resource_urls.empty()) {
        non_resource_rules.push_back(
            {{"verbs", r.verbs}, {"nonResourceURLs", r.non_resource_urls}});
      }
    };
    if (options_.authorization == AuthorizationMode::kRbac) {
      VisitRulesFor(*rbac_objects_, ri.user, spec.value("namespace", ""),
                    [&](const std::string&, const PolicyRule* rule, const std::string& error) {
                      if (rule) add(*rule);
                      if (!error.empty()) errors.push_back(error);
                      return true;
                    });
    } else {
      add(PolicyRule{{"*"}, {"*"}, {"*"}, {}, {}});
      add(PolicyRule{{"*"}, {}, {}, {}, {"*"}});
    }
    json status = {{"resourceRules", resource_rules},
                   {"nonResourceRules", non_resource_rules},
                   {"incomplete", !errors.empty()}};
    if (!errors.empty()) status["evaluationError"] = AggregateMessage(errors);
    reply("SelfSubjectRulesReview", {{"spec", spec}, {"status", status}});
    return;
  }

  auto user_json = [](const UserInfo& u) {
    json j = {{"username", u.name}, {"groups", u.groups}};
    if (!u.uid.empty()) j["uid"] = u.uid;
    return j;
  };
  if (ri.resource == "selfsubjectreviews") {
    decode(ReviewKind::kSelfSubjectReview);
    reply("SelfSubjectReview", {{"status", {{"userInfo", user_json(ri.user)}}}});
    return;
  }
  // tokenreviews
  json spec = decode(ReviewKind::kTokenReview);
  Authentication auth = Authenticate(spec.value("token", ""));
  json status;
  if (auth.ok) {
    status = {{"authenticated", true},
              {"user", user_json(auth.user)},
              {"audiences", json::array({kApiAudience})}};
  } else {
    status = {{"user", json::object()}, {"error", auth.error}};
  }
  reply("TokenReview", {{"spec", spec}, {"status", status}});
}

void ApiServer::ServeWatch(const HttpRequest& req, HttpResponder& resp, const RequestInfo& ri,
                           const ResourceInfo& info, const FaultDecision& fault) {
  ListOptions sel;
  sel.labels = LabelSelector::Parse(req.Query("labelSelector"));
  sel.fields = FieldSelector::Parse(req.Query("fieldSelector"), info.field_selectors);
  if (!ri.name.empty()) {
    // The legacy /watch/.../<name> form: a watch of the collection pinned to one name.
    std::string extra = req.Query("fieldSelector");
    sel.fields = FieldSelector::Parse(
        "metadata.name=" + ri.name + (extra.empty() ? "" : "," + extra), info.field_selectors);
  }
  bool table = WantsTable(req);
  IncludeObject include = IncludeFrom(req);
  const std::string content_type = table ? kTableContentType : kJson;
  auto write_event = [&](const std::string& line) { return resp.WriteChunk(line); };
  auto encode = [&](const std::string& type, const json& obj, bool first_table) {
    json o = obj;
    if (table && type != "BOOKMARK" && type != "ERROR") {
      o = BuildTable(info, {obj}, include, first_table,
                     obj["metadata"].value("resourceVersion", ""));
    }
    return json{{"type", type}, {"object", o}}.dump() + "\n";
  };

  std::shared_ptr<Watcher> watcher;
  std::string rv = req.Query("resourceVersion");
  try {
    if (fault.code == 410) throw GoneError("too old resource version: " + rv + " (injected)");
    watcher = store_.Watch(info, ri.ns, sel, rv);
  } catch (const ApiError& e) {
    if (e.code() != 410) throw;
    // Like the real server: a 200 stream carrying one ERROR event, then the end.
    if (!resp.BeginStream(200, content_type)) return;
    write_event(encode("ERROR", e.ToStatus(), false));
    resp.EndStream();
    return;
  }
  if (!resp.BeginStream(200, content_type)) {
    watcher->Stop();
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto deadline = Clock::time_point::max();
  if (req.HasQuery("timeoutSeconds")) {
    deadline = start +
               std::chrono::seconds(std::strtoll(req.Query("timeoutSeconds").c_str(), nullptr, 10));
  }
  bool bookmarks = TrueParam(req.Query("allowWatchBookmarks"));
  bool initial_events_end = TrueParam(req.Query("sendInitialEvents")) && (rv.empty() || rv == "0");
  auto next_bookmark = start + options_.bookmark_interval;
  int sent = 0;
  bool first_table = true;
  auto finish = [&] {
    watcher->Stop();
    resp.EndStream();
  };
  if (fault.cut_after_events == 0 && !fault.mid_line) {
    watcher->Stop();
    resp.Abort();
    return;
  }
  while (!stopping_) {
    auto now = Clock::now();
    if (now >= deadline) break;
    // Wake at least every 200 ms to notice a client that went away.
    auto wake = std::min({deadline, now + std::chrono::milliseconds(200),
                          bookmarks ? next_bookmark : Clock::time_point::max()});
    WatchEvent ev;
    auto r = watcher->Next(&ev, wake);
    if (r == Watcher::Result::kStopped) break;
    if (r == Watcher::Result::kEvent) {
      std::string line = encode(ev.type, ev.object, first_table);
      first_table = false;
      if (fault.cut_after_events >= 0 && sent >= fault.cut_after_events && fault.mid_line) {
        watcher->Stop();
        resp.WritePartialChunkAndAbort(line, line.size() / 2);
        return;
      }
      if (!write_event(line)) break;
      ++sent;
      if (fault.cut_after_events >= 0 && sent >= fault.cut_after_events && !fault.mid_line) {
        watcher->Stop();
        resp.Abort();
        return;
      }
      continue;
    }
    if (initial_events_end) {
      uint64_t progress = watcher->IdleProgress();
      if (progress) {
        json bm = {{"kind", info.kind},
                   {"apiVersion", info.api_version()},
                   {"metadata",
                    {{"resourceVersion", std::to_string(progress)},
                     {"annotations", {{"k8s.io/initial-events-end", "true"}}}}}};
        if (!write_event(encode("BOOKMARK", bm, false))) break;
        initial_events_end = false;
      }
    }
    if (bookmarks && Clock::now() >= next_bookmark) {
      next_bookmark = Clock::now() + options_.bookmark_interval;
      uint64_t progress = watcher->IdleProgress();
      if (progress) {
        json bm = {{"kind", info.kind},
                   {"apiVersion", info.api_version()},
                   {"metadata", {{"resourceVersion", std::to_string(progress)}}}};
        if (!write_event(encode("BOOKMARK", bm, false))) break;
      }
    }
    if (resp.PeerGone()) {
      watcher->Stop();
      resp.Abort();
      return;
    }
  }
  finish();
}

std::string KubeconfigFor(int port) {
  return KubeconfigFor(port, "kube-test-user", kAdminToken, "default");
}

std::string KubeconfigFor(int port, const std::string& user, const std::string& token,
                          const std::string& ns, const std::string& as) {
  // Plain YAML scalars where they are safe, so the admin's file stays as it always was.
  auto scalar = [](const std::string& v) {
    bool plain = !v.empty() && std::all_of(v.begin(), v.end(), [](unsigned char c) {
      return std::isalnum(c) || c == '-' || c == '_' || c == '.';
    });
    return plain ? v : json(v).dump();
  };
  std::string server = "http://127.0.0.1:" + std::to_string(port);
  return "apiVersion: v1\n"
         "kind: Config\n"
         "clusters:\n"
         "- name: kube-test-server\n"
         "  cluster:\n"
         "    server: " +
         server +
         "\n"
         "users:\n"
         "- name: " +
         scalar(user) +
         "\n"
         "  user:\n"
         "    token: " +
         scalar(token) + "\n" + (as.empty() ? "" : "    as: " + scalar(as) + "\n") +
         "contexts:\n"
         "- name: kube-test-server\n"
         "  context:\n"
         "    cluster: kube-test-server\n"
         "    user: " +
         scalar(user) +
         "\n"
         "    namespace: " +
         scalar(ns) +
         "\n"
         "current-context: kube-test-server\n"
         "preferences: {}\n";
}

}  // namespace spawnpoint::kubetest
