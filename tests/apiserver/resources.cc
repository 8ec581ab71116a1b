#include "tests/apiserver/resources.h"

#include <algorithm>

#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest {
namespace {

const std::vector<std::string> kAllVerbs = {"create", "delete", "deletecollection", "get",
                                            "list",   "patch",  "update",           "watch"};

ResourceInfo Builtin(std::string group, std::string version, std::string plural,
                     std::string singular, std::string kind, bool namespaced,
                     std::vector<std::string> short_names = {},
                     std::vector<std::string> categories = {}) {
  ResourceInfo r;
  r.group = std::move(group);
  r.version = std::move(version);
  r.plural = std::move(plural);
  r.singular = std::move(singular);
  r.kind = std::move(kind);
  r.list_kind = r.kind + "List";
  r.namespaced = namespaced;
  r.verbs = kAllVerbs;
  r.short_names = std::move(short_names);
  r.categories = std::move(categories);
  r.field_selectors = {"metadata.name", "metadata.namespace"};
  return r;
}

std::vector<ResourceInfo> Builtins() {
  std::vector<ResourceInfo> out;
  auto ns = Builtin("", "v1", "namespaces", "namespace", "Namespace", false, {"ns"});
  ns.status_subresource = true;
  ns.field_selectors.push_back("status.phase");
  out.push_back(ns);

  auto node = Builtin("", "v1", "nodes", "node", "Node", false, {"no"});
  node.status_subresource = true;
  node.field_selectors.push_back("spec.unschedulable");
  out.push_back(node);

  auto pod = Builtin("", "v1", "pods", "pod", "Pod", true, {"po"}, {"all"});
  pod.status_subresource = true;
  for (const char* f :
       {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"}) {
    pod.field_selectors.push_back(f);
  }
  out.push_back(pod);

  auto svc = Builtin("", "v1", "services", "service", "Service", true, {"svc"}, {"all"});
  svc.status_subresource = true;
  out.push_back(svc);

  auto ev = Builtin("", "v1", "events", "event", "Event", true, {"ev"});
  for (const char* f :
       {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}) {
    ev.field_selectors.push_back(f);
  }
  out.push_back(ev);

  out.push_back(Builtin("", "v1", "configmaps", "configmap", "ConfigMap", true, {"cm"}));
  auto secret = Builtin("", "v1", "secrets", "secret", "Secret", true);
  secret.field_selectors.push_back("type");
  out.push_back(secret);
  out.push_back(
      Builtin("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, {"sa"}));

  auto deploy =
      Builtin("apps", "v1", "deployments", "deployment", "Deployment", true, {"deploy"}, {"all"});
  deploy.status_subresource = true;
  deploy.has_generation = true;
  out.push_back(deploy);

  out.push_back(Builtin("coordination.k8s.io", "v1", "leases", "lease", "Lease", true));

  auto crd =
      Builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
              "CustomResourceDefinition", false, {"crd", "crds"}, {"api-extensions"});
  crd.status_subresource = true;
  crd.has_generation = true;
  out.push_back(crd);

  const std::string rbac = "rbac.authorization.k8s.io";
  out.push_back(Builtin(rbac, "v1", "roles", "role", "Role", true));
  out.push_back(Builtin(rbac, "v1", "rolebindings", "rolebinding", "RoleBinding", true));
  out.push_back(Builtin(rbac, "v1", "clusterroles", "clusterrole", "ClusterRole", false));
  out.push_back(Builtin(rbac, "v1", "clusterrolebindings", "clusterrolebinding",
                        "ClusterRoleBinding", false));
  return out;
}

}  // namespace

Registry::Registry() : resources_(Builtins()) {}

std::optional<ResourceInfo> Registry::Find(const std::string& group, const std::string& version,
                                           const std::string& plural) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : resources_) {
    if (r.group == group && r.version == version && r.plural == plural) return r;
  }
  return std::nullopt;
}

std::optional<ResourceInfo> Registry::FindAnyVersion(const std::string& group,
                                                     const std::string& plural) const {
  std::lock_guard<std::mutex> lock(mu_);
  const ResourceInfo* found = nullptr;
  for (const auto& r : resources_) {
    if (r.group != group || r.plural != plural) continue;
    if (!found || (r.custom && r.version == r.storage_version)) found = &r;
  }
  if (found) return *found;
  return std::nullopt;
}

std::optional<ResourceInfo> Registry::FindByKind(const std::string& api_version,
                                                 const std::string& kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : resources_) {
    if (r.api_version() == api_version && r.kind == kind) return r;
  }
  return std::nullopt;
}

std::vector<ResourceInfo> Registry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resources_;
}

std::vector<std::pair<std::string, std::vector<std::string>>> Registry::Groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& r : resources_) {
    if (r.group.empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == r.group; });
    if (it == groups.end()) {
      groups.push_back({r.group, {}});
      it = groups.end() - 1;
    }
    auto& versions = it->second;
    if (std::find(versions.begin(), versions.end(), r.version) != versions.end()) continue;
    // The storage version of a CRD is its preferred version.
    if (r.custom && r.version == r.storage_version) {
      versions.insert(versions.begin(), r.version);
    } else {
      versions.push_back(r.version);
    }
  }
  return groups;
}

uint64_t Registry::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

std::vector<FieldError> CheckCrd(const json& crd) {
  std::vector<FieldError> errs;
  const json spec = crd.value("spec", json::object());
  const json names = spec.value("names", json::object());
  std::string group = spec.value("group", "");
  std::string plural = names.value("plural", "");
  std::string kind = names.value("kind", "");
  std::string name = crd.value("metadata", json::object()).value("name", "");
  if (group.empty()) errs.push_back({FieldError::Type::kRequired, "spec.group", nullptr, ""});
  if (plural.empty()) {
    errs.push_back({FieldError::Type::kRequired, "spec.names.plural", nullptr, ""});
  } else if (plural != Lower(plural)) {
    errs.push_back({FieldError::Type::kInvalid, "spec.names.plural", plural,
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-'"});
  }
  if (kind.empty()) errs.push_back({FieldError::Type::kRequired, "spec.names.kind", nullptr, ""});
  if (!plural.empty() && !group.empty() && name != plural + "." + group) {
    errs.push_back({FieldError::Type::kInvalid, "metadata.name", name,
                    "must be spec.names.plural+\".\"+spec.group"});
  }
  std::string scope = spec.value("scope", "");
  if (scope != "Namespaced" && scope != "Cluster") {
    errs.push_back({FieldError::Type::kNotSupported, "spec.scope", scope,
                    "supported values: \"Cluster\", \"Namespaced\""});
  }
  const json versions = spec.value("versions", json::array());
  if (!versions.is_array() || versions.empty()) {
    errs.push_back({FieldError::Type::kInvalid, "spec.versions", versions,
                    "must have exactly one version marked as storage version"});
    return errs;
  }
  int storage = 0;
  for (size_t i = 0; i < versions.size(); ++i) {
    const json& v = versions[i];
    std::string path = "spec.versions[" + std::to_string(i) + "]";
    if (v.value("name", "").empty()) {
      errs.push_back({FieldError::Type::kRequired, path + ".name", nullptr, ""});
    }
    if (v.value("storage", false)) ++storage;
    const json schema = v.value("schema", json::object()).value("openAPIV3Schema", json());
    if (!schema.is_object()) {
      errs.push_back({FieldError::Type::kRequired, path + ".schema.openAPIV3Schema", nullptr,
                      "schemas are required"});
    } else if (schema.value("type", "") != "object") {
      errs.push_back({FieldError::Type::kRequired, path + ".schema.openAPIV3Schema.type", nullptr,
                      "must not be empty at the root"});
    }
  }
  if (storage != 1) {
    errs.push_back({FieldError::Type::kInvalid, "spec.versions", storage,
                    "must have exactly one version marked as storage version"});
  }
  return errs;
}

void Registry::RegisterCrd(const json& crd) {
  const json spec = crd.value("spec", json::object());
  const json names = spec.value("names", json::object());
  std::string crd_name = crd["metadata"].value("name", "");
  std::string storage_version;
  for (const auto& v : spec["versions"]) {
    if (v.value("storage", false)) storage_version = v.value("name", "");
  }
  std::vector<ResourceInfo> infos;
  for (const auto& v : spec["versions"]) {
    if (!v.value("served", true)) continue;
    ResourceInfo r;
    r.group = spec.value("group", "");
    r.version = v.value("name", "");
    r.plural = names.value("plural", "");
    r.singular = names.value("singular", Lower(names.value("kind", "")));
    r.kind = names.value("kind", "");
    r.list_kind = names.value("listKind", r.kind + "List");
    r.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
    r.verbs = kAllVerbs;
    r.short_names = names.value("shortNames", std::vector<std::string>{});
    r.categories = names.value("categories", std::vector<std::string>{});
    const json subresources = v.value("subresources", json::object());
    r.status_subresource = subresources.contains("status");
    r.has_generation = true;
    r.allow_unconditional_update = false;
    r.field_selectors = {"metadata.name", "metadata.namespace"};
    for (const auto& f : v.value("selectableFields", json::array())) {
      std::string path = f.value("jsonPath", "");
      if (!path.empty() && path[0] == '.') path = path.substr(1);
      r.field_selectors.push_back(path);
    }
    r.custom = true;
    r.crd_name = crd_name;
    r.schema = v.value("schema", json::object()).value("openAPIV3Schema", json());
    r.printer_columns = v.value("additionalPrinterColumns", json());
    r.storage_version = storage_version;
    infos.push_back(std::move(r));
  }
  std::lock_guard<std::mutex> lock(mu_);
  resources_.erase(std::remove_if(resources_.begin(), resources_.end(),
                                  [&](const ResourceInfo& r) { return r.crd_name == crd_name; }),
                   resources_.end());
  for (auto& r : infos) resources_.push_back(std::move(r));
  ++generation_;
}

void Registry::UnregisterCrd(const std::string& crd_name) {
  if (crd_name.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  resources_.erase(std::remove_if(resources_.begin(), resources_.end(),
                                  [&](const ResourceInfo& r) { return r.crd_name == crd_name; }),
                   resources_.end());
  ++generation_;
}

}  // namespace spawnpoint::kubetest
