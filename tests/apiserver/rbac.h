// RBAC authorization as kube-apiserver does it (k8s.io/apiserver request attributes,
// plugin/pkg/auth/authorizer/rbac and pkg/registry/rbac/validation), kept free of the
// store and of HTTP so the matching rules can be unit-tested:
//   - RequestAttributes() derives verb, API group, resource, subresource, namespace and
//     name from a request the way RequestInfoFactory does (watch=true and /watch/ are
//     "watch"; a list or watch with fieldSelector metadata.name=X carries the name X;
//     GET /api/v1/namespaces/ns is in namespace "ns"; /api/v1 and /apis/g/v are
//     non-resource paths);
//   - RuleAllows() is rbac.RuleAllows: "*" for verbs, apiGroups and resources; a resource
//     "pods/status" matches only that subresource; "*/status" matches the status
//     subresource of every resource (there is no "pods/*"); resourceNames only match a
//     request that names an object (so never a create, nor a list/watch without a
//     metadata.name field selector); nonResourceURLs match exactly or by a trailing "*";
//   - Authorize() lets the system:masters group do anything (like the privileged-group
//     authorizer in front of RBAC), then visits every ClusterRoleBinding and, for a
//     namespaced request, the RoleBindings of that namespace whose subjects match the
//     user (User by name, Group by membership, ServiceAccount by namespace and name, the
//     namespace defaulting to the RoleBinding's); a RoleBinding may reference a Role of
//     its namespace or a ClusterRole, whose rules then apply in that namespace only.
//     ClusterRoles with an aggregationRule get the rules of the ClusterRoles their
//     selectors match (computed on the fly, the stored object is not rewritten). Missing
//     roles become the denial reason "RBAC: role.rbac.authorization.k8s.io "x" not
//     found", as upstream;
//   - ForbiddenError() is the 403 responsewriters.Forbidden writes.
// Pure functions and plain values; RbacObjects implementations decide their own
// thread-safety (the server's reads the Store, which is thread-safe).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {

using json = nlohmann::json;

// Well-known user and group names.
inline constexpr const char* kSystemMasters = "system:masters";
inline constexpr const char* kAllAuthenticated = "system:authenticated";
inline constexpr const char* kAllUnauthenticated = "system:unauthenticated";
inline constexpr const char* kAnonymousUser = "system:anonymous";

struct UserInfo {
  std::string name;
  std::string uid;
  std::vector<std::string> groups;

  bool InGroup(const std::string& group) const;
};

inline constexpr const char* kServiceAccountUserPrefix = "system:serviceaccount:";

// "system:serviceaccount:<ns>:<name>": the user name of a service account.
inline std::string ServiceAccountUserName(const std::string& ns, const std::string& name) {
  return kServiceAccountUserPrefix + ns + ":" + name;
}
// That user with its groups (system:serviceaccounts, system:serviceaccounts:<ns>,
// system:authenticated).
UserInfo ServiceAccountUser(const std::string& ns, const std::string& name,
                            const std::string& uid = "");
// Splits "system:serviceaccount:<ns>:<name>"; false for any other user name.
bool ParseServiceAccountUser(const std::string& user, std::string* ns, std::string* name);

// authorizer.Attributes.
struct Attributes {
  UserInfo user;
  std::string verb;
  bool resource_request = false;
  std::string path;  // the URL path (non-resource requests are matched on it)
  std::string api_group;
  std::string api_version;
  std::string resource;
  std::string subresource;
  std::string ns;
  std::string name;
};

// "/api/v1/pods/" -> {"api", "v1", "pods"}: the non-empty segments of a URL path.
std::vector<std::string> SplitPath(const std::string& path);

// The attributes of an HTTP request (user left empty). `query` is the decoded query.
Attributes RequestAttributes(const std::string& method, const std::string& path,
                             const std::map<std::string, std::string>& query);

struct PolicyRule {
  std::vector<std::string> verbs;
  std::vector<std::string> api_groups;
  std::vector<std::string> resources;
  std::vector<std::string> resource_names;
  std::vector<std::string> non_resource_urls;

  static PolicyRule FromJson(const json& rule);
  json ToJson() const;
};

bool RuleAllows(const Attributes& attributes, const PolicyRule& rule);
// Whether one subject of a binding names the user. `binding_ns` is the RoleBinding's
// namespace ("" for a ClusterRoleBinding); a ServiceAccount subject without a namespace
// means that one.
bool SubjectMatches(const UserInfo& user, const json& subject, const std::string& binding_ns);

// Read access to the stored RBAC objects (as JSON, the way the API serves them).
class RbacObjects {
 public:
  virtual ~RbacObjects() = default;
  virtual std::vector<json> ClusterRoleBindings() const = 0;
  virtual std::vector<json> RoleBindings(const std::string& ns) const = 0;
  virtual std::vector<json> ClusterRoles() const = 0;
  virtual std::optional<json> ClusterRole(const std::string& name) const = 0;
  virtual std::optional<json> Role(const std::string& ns, const std::string& name) const = 0;
};

// Calls `visit(source, rule, error)` for every rule that applies to `user` in `ns` ("" =
// cluster-wide rules only), in upstream order, and for each role that cannot be resolved
// (rule null, error set). `source` describes the binding, e.g. `ClusterRoleBinding "b" of
// ClusterRole "r" to ServiceAccount "sa/ns"`. Visiting stops when `visit` returns false.
using RuleVisitor = std::function<bool(const std::string& source, const PolicyRule* rule,
                                       const std::string& error)>;
void VisitRulesFor(const RbacObjects& objects, const UserInfo& user, const std::string& ns,
                   const RuleVisitor& visit);

struct Decision {
  bool allowed = false;
  // Allowed: `RBAC: allowed by <source>` ("" for system:masters). Denied: "" or
  // `RBAC: [<resolution errors>]`.
  std::string reason;
};

Decision Authorize(const RbacObjects& objects, const Attributes& attributes);

// `User "u" cannot list resource "pods" in API group "" in the namespace "default"`, or
// `... at the cluster scope`, or `User "u" cannot get path "/foo"`.
std::string ForbiddenMessage(const Attributes& attributes);
// The 403 Status: message `pods "p" is forbidden: <ForbiddenMessage>[: <reason>]`,
// details {name, group, kind: <resource>}.
ApiError AuthorizationForbiddenError(const Attributes& attributes, const std::string& reason);

// The default objects a real cluster has that matter to tests: cluster-admin (bound to
// system:masters), system:discovery, system:public-info-viewer and system:basic-user
// (bound to system:authenticated; public-info-viewer also to system:unauthenticated).
std::vector<json> BootstrapClusterRoles();
std::vector<json> BootstrapClusterRoleBindings();

}  // namespace spawnpoint::kubetest
