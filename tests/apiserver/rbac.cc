#include "tests/apiserver/rbac.h"

#include <algorithm>

#include "tests/apiserver/selectors.h"
#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest {
namespace {

constexpr const char* kRbacGroup = "rbac.authorization.k8s.io";

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Query(const std::map<std::string, std::string>& query, const std::string& key) {
  auto it = query.find(key);
  return it == query.end() ? "" : it->second;
}

// Go's %q for the names that occur here.
std::string Quote(const std::string& s) { return json(s).dump(); }

// The name a fieldSelector pins with metadata.name=X or ==X (fields.RequiresExactMatch),
// when it is a valid path segment name.
std::string NameFromFieldSelector(const std::string& selector) {
  size_t start = 0;
  while (start <= selector.size()) {
    size_t comma = selector.find(',', start);
    if (comma == std::string::npos) comma = selector.size();
    std::string term = selector.substr(start, comma - start);
    start = comma + 1;
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(' '));
      s.erase(s.find_last_not_of(' ') + 1);
      return s;
    };
    size_t eq = term.find('=');
    if (eq == std::string::npos || (eq > 0 && term[eq - 1] == '!')) continue;
    if (trim(term.substr(0, eq)) != "metadata.name") continue;
    std::string value = term.substr(eq + 1);
    if (!value.empty() && value[0] == '=') value.erase(0, 1);
    value = trim(value);
    if (value.empty() || value == "." || value == ".." ||
        value.find_first_of("/%") != std::string::npos) {
      return "";
    }
    return value;
  }
  return "";
}

std::string MetaName(const json& obj) { return Str(obj.value("metadata", json::object()), "name"); }
std::string MetaNamespace(const json& obj) {
  return Str(obj.value("metadata", json::object()), "namespace");
}

std::vector<PolicyRule> RulesOf(const json& role) {
  std::vector<PolicyRule> rules;
  if (!role.contains("rules") || !role["rules"].is_array()) return rules;
  for (const auto& r : role["rules"]) rules.push_back(PolicyRule::FromJson(r));
  return rules;
}

// The rules of a ClusterRole; an aggregated one gets those of the roles it selects.
std::vector<PolicyRule> ClusterRoleRules(const RbacObjects& objects, const json& role, int depth) {
  const json agg = role.value("aggregationRule", json());
  if (!agg.is_object() || !agg.contains("clusterRoleSelectors") ||
      !agg["clusterRoleSelectors"].is_array() || depth > 4) {
    return RulesOf(role);
  }
  std::vector<LabelSelector> selectors;
  for (const auto& s : agg["clusterRoleSelectors"]) {
    try {
      selectors.push_back(LabelSelector::FromJson(s));
    } catch (const ApiError&) {
      // An invalid selector selects nothing, as the aggregation controller skips it.
    }
  }
  std::vector<PolicyRule> rules;
  std::vector<json> seen;
  const std::string self = MetaName(role);
  for (const json& other : objects.ClusterRoles()) {
    if (MetaName(other) == self) continue;
    json labels = other.value("metadata", json::object()).value("labels", json());
    bool selected = std::any_of(selectors.begin(), selectors.end(),
                                [&](const LabelSelector& s) { return s.Matches(labels); });
    if (!selected) continue;
    for (const auto& r : ClusterRoleRules(objects, other, depth + 1)) {
      json j = r.ToJson();
      if (std::find(seen.begin(), seen.end(), j) != seen.end()) continue;
      seen.push_back(j);
      rules.push_back(r);
    }
  }
  return rules;
}

// GetRoleReferenceRules: the rules of the role a binding references, or an error text.
std::vector<PolicyRule> RoleRefRules(const RbacObjects& objects, const json& role_ref,
                                     const std::string& binding_ns, std::string* error) {
  std::string kind = Str(role_ref, "kind");
  std::string name = Str(role_ref, "name");
  if (kind == "Role") {
    auto role = objects.Role(binding_ns, name);
    if (!role) {
      *error = std::string("role.") + kRbacGroup + " " + Quote(name) + " not found";
      return {};
    }
    return RulesOf(*role);
  }
  if (kind == "ClusterRole") {
    auto role = objects.ClusterRole(name);
    if (!role) {
      *error = std::string("clusterrole.") + kRbacGroup + " " + Quote(name) + " not found";
      return {};
    }
    return ClusterRoleRules(objects, *role, 0);
  }
  *error = "unsupported role reference kind: " + Quote(kind);
  return {};
}

std::string DescribeSubject(const json& s, const std::string& binding_ns) {
  std::string kind = Str(s, "kind");
  std::string name = Str(s, "name");
  if (kind == "ServiceAccount") {
    std::string ns = Str(s, "namespace");
    return kind + " " + Quote(name + "/" + (ns.empty() ? binding_ns : ns));
  }
  return kind + " " + Quote(name);
}

// appliesTo: the index of the first matching subject, or -1.
int MatchingSubject(const UserInfo& user, const json& binding, const std::string& binding_ns) {
  const json subjects = binding.value("subjects", json::array());
  if (!subjects.is_array()) return -1;
  for (size_t i = 0; i < subjects.size(); ++i) {
    if (SubjectMatches(user, subjects[i], binding_ns)) return static_cast<int>(i);
  }
  return -1;
}

json Meta(const std::string& name) {
  return {{"name", name},
          {"labels", {{"kubernetes.io/bootstrapping", "rbac-defaults"}}},
          {"annotations", {{"rbac.authorization.kubernetes.io/autoupdate", "true"}}}};
}

json ClusterRoleJson(const std::string& name, const json& rules) {
  return {{"apiVersion", std::string(kRbacGroup) + "/v1"},
          {"kind", "ClusterRole"},
          {"metadata", Meta(name)},
          {"rules", rules}};
}

json ClusterRoleBindingJson(const std::string& name, const std::vector<std::string>& groups) {
  json subjects = json::array();
  for (const auto& g : groups) {
    subjects.push_back({{"apiGroup", kRbacGroup}, {"kind", "Group"}, {"name", g}});
  }
  return {{"apiVersion", std::string(kRbacGroup) + "/v1"},
          {"kind", "ClusterRoleBinding"},
          {"metadata", Meta(name)},
          {"roleRef", {{"apiGroup", kRbacGroup}, {"kind", "ClusterRole"}, {"name", name}}},
          {"subjects", subjects}};
}

}  // namespace

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t slash = path.find('/', i);
    if (slash == std::string::npos) slash = path.size();
    if (slash > i) parts.push_back(path.substr(i, slash - i));
    i = slash + 1;
  }
  return parts;
}

bool UserInfo::InGroup(const std::string& group) const { return Contains(groups, group); }

UserInfo ServiceAccountUser(const std::string& ns, const std::string& name,
                            const std::string& uid) {
  UserInfo u;
  u.name = ServiceAccountUserName(ns, name);
  u.uid = uid;
  u.groups = {"system:serviceaccounts", "system:serviceaccounts:" + ns, kAllAuthenticated};
  return u;
}

bool ParseServiceAccountUser(const std::string& user, std::string* ns, std::string* name) {
  const std::string prefix = kServiceAccountUserPrefix;
  if (user.rfind(prefix, 0) != 0) return false;
  std::string rest = user.substr(prefix.size());
  size_t colon = rest.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= rest.size()) return false;
  if (rest.find(':', colon + 1) != std::string::npos) return false;
  *ns = rest.substr(0, colon);
  *name = rest.substr(colon + 1);
  return true;
}

Attributes RequestAttributes(const std::string& method, const std::string& path,
                             const std::map<std::string, std::string>& query) {
  Attributes a;
  a.path = path;
  a.verb = Lower(method);
  auto parts = SplitPath(path);
  if (parts.size() < 3 || (parts[0] != "api" && parts[0] != "apis")) return a;
  size_t i = 1;
  if (parts[0] == "apis") {
    if (parts.size() - 1 < 3) return a;
    a.api_group = parts[i++];
  }
  a.resource_request = true;
  a.api_version = parts[i++];
  std::vector<std::string> rest(parts.begin() + static_cast<long>(i), parts.end());
  if (rest.empty()) return a;
  if (rest[0] == "watch" || rest[0] == "proxy") {
    a.verb = rest[0];
    rest.erase(rest.begin());
    if (rest.empty()) return a;
  } else if (method == "POST") {
    a.verb = "create";
  } else if (method == "GET" || method == "HEAD") {
    a.verb = "get";
  } else if (method == "PUT") {
    a.verb = "update";
  } else if (method == "PATCH") {
    a.verb = "patch";
  } else if (method == "DELETE") {
    a.verb = "delete";
  } else {
    a.verb = "";
  }
  if (rest[0] == "namespaces") {
    if (rest.size() > 1) {
      a.ns = rest[1];
      // namespaces/<ns>/status and /finalize are subresources of the namespace itself.
      if (rest.size() > 2 && rest[2] != "status" && rest[2] != "finalize") {
        rest.erase(rest.begin(), rest.begin() + 2);
      }
    }
  }
  if (rest.size() >= 3 && a.verb != "proxy") a.subresource = rest[2];
  if (rest.size() >= 2) a.name = rest[1];
  a.resource = rest[0];
  if (a.name.empty() && a.verb == "get") {
    a.verb = TrueParam(Query(query, "watch")) ? "watch" : "list";
    a.name = NameFromFieldSelector(Query(query, "fieldSelector"));
  }
  if (a.name.empty() && a.verb == "delete") a.verb = "deletecollection";
  return a;
}

PolicyRule PolicyRule::FromJson(const json& rule) {
  PolicyRule r;
  r.verbs = Strings(rule, "verbs");
  r.api_groups = Strings(rule, "apiGroups");
  r.resources = Strings(rule, "resources");
  r.resource_names = Strings(rule, "resourceNames");
  r.non_resource_urls = Strings(rule, "nonResourceURLs");
  return r;
}

json PolicyRule::ToJson() const {
  json j = {{"verbs", verbs}};
  if (!api_groups.empty()) j["apiGroups"] = api_groups;
  if (!resources.empty()) j["resources"] = resources;
  if (!resource_names.empty()) j["resourceNames"] = resource_names;
  if (!non_resource_urls.empty()) j["nonResourceURLs"] = non_resource_urls;
  return j;
}

bool RuleAllows(const Attributes& a, const PolicyRule& rule) {
  bool verb = Contains(rule.verbs, "*") || Contains(rule.verbs, a.verb);
  if (!verb) return false;
  if (!a.resource_request) {
    for (const auto& url : rule.non_resource_urls) {
      if (url == "*" || url == a.path) return true;
      if (!url.empty() && url.back() == '*' &&
          a.path.rfind(url.substr(0, url.find_last_not_of('*') + 1), 0) == 0) {
        return true;
      }
    }
    return false;
  }
  if (!Contains(rule.api_groups, "*") && !Contains(rule.api_groups, a.api_group)) return false;
  std::string combined = a.subresource.empty() ? a.resource : a.resource + "/" + a.subresource;
  bool resource = false;
  for (const auto& r : rule.resources) {
    if (r == "*" || r == combined) {
      resource = true;
      break;
    }
    // "*/<subresource>" matches that subresource of every resource.
    if (!a.subresource.empty() && r == "*/" + a.subresource) {
      resource = true;
      break;
    }
  }
  if (!resource) return false;
  return rule.resource_names.empty() || Contains(rule.resource_names, a.name);
}

bool SubjectMatches(const UserInfo& user, const json& subject, const std::string& binding_ns) {
  std::string kind = Str(subject, "kind");
  std::string name = Str(subject, "name");
  if (kind == "User") return user.name == name;
  if (kind == "Group") return user.InGroup(name);
  if (kind == "ServiceAccount") {
    std::string ns = Str(subject, "namespace");
    if (ns.empty()) ns = binding_ns;
    if (ns.empty()) return false;
    return user.name == ServiceAccountUserName(ns, name);
  }
  return false;
}

void VisitRulesFor(const RbacObjects& objects, const UserInfo& user, const std::string& ns,
                   const RuleVisitor& visit) {
  for (const json& b : objects.ClusterRoleBindings()) {
    int idx = MatchingSubject(user, b, "");
    if (idx < 0) continue;
    std::string error;
    const json role_ref = b.value("roleRef", json::object());
    auto rules = RoleRefRules(objects, role_ref, "", &error);
    if (!error.empty()) {
      if (!visit("", nullptr, error)) return;
      continue;
    }
    std::string source = "ClusterRoleBinding " + Quote(MetaName(b)) + " of " +
                         Str(role_ref, "kind") + " " + Quote(Str(role_ref, "name")) + " to " +
                         DescribeSubject(b["subjects"][static_cast<size_t>(idx)], "");
    for (const auto& r : rules) {
      if (!visit(source, &r, "")) return;
    }
  }
  if (ns.empty()) return;
  for (const json& b : objects.RoleBindings(ns)) {
    std::string binding_ns = MetaNamespace(b);
    if (binding_ns.empty()) binding_ns = ns;
    int idx = MatchingSubject(user, b, binding_ns);
    if (idx < 0) continue;
    std::string error;
    const json role_ref = b.value("roleRef", json::object());
    auto rules = RoleRefRules(objects, role_ref, binding_ns, &error);
    if (!error.empty()) {
      if (!visit("", nullptr, error)) return;
      continue;
    }
    std::string source = "RoleBinding " + Quote(MetaName(b) + "/" + binding_ns) + " of " +
                         Str(role_ref, "kind") + " " + Quote(Str(role_ref, "name")) + " to " +
                         DescribeSubject(b["subjects"][static_cast<size_t>(idx)], binding_ns);
    for (const auto& r : rules) {
      if (!visit(source, &r, "")) return;
    }
  }
}

Decision Authorize(const RbacObjects& objects, const Attributes& attributes) {
  if (attributes.user.InGroup(kSystemMasters)) return {true, ""};
  Decision d;
  std::vector<std::string> errors;
  VisitRulesFor(objects, attributes.user, attributes.ns,
                [&](const std::string& source, const PolicyRule* rule, const std::string& error) {
                  if (rule && RuleAllows(attributes, *rule)) {
                    d.allowed = true;
                    d.reason = "RBAC: allowed by " + source;
                    return false;
                  }
                  if (!error.empty()) errors.push_back(error);
                  return true;
                });
  if (!d.allowed && !errors.empty()) d.reason = "RBAC: " + AggregateMessage(errors);
  return d;
}

std::string ForbiddenMessage(const Attributes& a) {
  std::string user = Quote(a.user.name);
  if (!a.resource_request) {
    return "User " + user + " cannot " + a.verb + " path " + Quote(a.path);
  }
  std::string resource = a.subresource.empty() ? a.resource : a.resource + "/" + a.subresource;
  std::string msg = "User " + user + " cannot " + a.verb + " resource " + Quote(resource) +
                    " in API group " + Quote(a.api_group);
  if (!a.ns.empty()) return msg + " in the namespace " + Quote(a.ns);
  return msg + " at the cluster scope";
}

ApiError AuthorizationForbiddenError(const Attributes& a, const std::string& reason) {
  // responsewriters.Forbidden escapes what could pass for HTML.
  std::string msg;
  for (char c : ForbiddenMessage(a)) {
    if (c == '&') {
      msg += "&amp;";
    } else if (c == '<') {
      msg += "&lt;";
    } else if (c == '>') {
      msg += "&gt;";
    } else {
      msg += c;
    }
  }
  if (!reason.empty()) msg += ": " + reason;
  // apierrors.NewForbidden(GroupResource{group, resource}, name, err).
  std::string qualified = a.api_group.empty() ? a.resource : a.resource + "." + a.api_group;
  std::string message;
  if (qualified.empty()) {
    message = "forbidden: " + msg;
  } else if (a.name.empty()) {
    message = qualified + " is forbidden: " + msg;
  } else {
    message = qualified + " " + Quote(a.name) + " is forbidden: " + msg;
  }
  json details = json::object();
  if (!a.name.empty()) details["name"] = a.name;
  if (!a.api_group.empty()) details["group"] = a.api_group;
  if (!a.resource.empty()) details["kind"] = a.resource;
  return ApiError(403, "Forbidden", message, details);
}

std::vector<json> BootstrapClusterRoles() {
  json discovery_urls = {"/api",     "/api/*",     "/apis",   "/apis/*",  "/healthz", "/livez",
                         "/openapi", "/openapi/*", "/readyz", "/version", "/version/"};
  json public_urls = {"/healthz", "/livez", "/readyz", "/version", "/version/"};
  return {
      ClusterRoleJson("cluster-admin",
                      json::array({{{"apiGroups", {"*"}}, {"resources", {"*"}}, {"verbs", {"*"}}},
                                   {{"nonResourceURLs", {"*"}}, {"verbs", {"*"}}}})),
      ClusterRoleJson("system:discovery",
                      json::array({{{"nonResourceURLs", discovery_urls}, {"verbs", {"get"}}}})),
      ClusterRoleJson("system:public-info-viewer",
                      json::array({{{"nonResourceURLs", public_urls}, {"verbs", {"get"}}}})),
      ClusterRoleJson(
          "system:basic-user",
          json::array({{{"apiGroups", {"authorization.k8s.io"}},
                        {"resources", {"selfsubjectaccessreviews", "selfsubjectrulesreviews"}},
                        {"verbs", {"create"}}},
                       {{"apiGroups", {"authentication.k8s.io"}},
                        {"resources", {"selfsubjectreviews"}},
                        {"verbs", {"create"}}}})),
  };
}

std::vector<json> BootstrapClusterRoleBindings() {
  return {
      ClusterRoleBindingJson("cluster-admin", {kSystemMasters}),
      ClusterRoleBindingJson("system:discovery", {kAllAuthenticated}),
      ClusterRoleBindingJson("system:public-info-viewer", {kAllAuthenticated, kAllUnauthenticated}),
      ClusterRoleBindingJson("system:basic-user", {kAllAuthenticated}),
  };
}

}  // namespace spawnpoint::kubetest
