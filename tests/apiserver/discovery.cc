#include "tests/apiserver/discovery.h"

#include <algorithm>
#include <cstdio>
#include <functional>

namespace spawnpoint::kubetest {
namespace {

const char* kObjectMetaRef = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const char* kListMetaRef = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

std::vector<ResourceInfo> InGroupVersion(const Registry& registry, const std::string& group,
                                         const std::string& version) {
  std::vector<ResourceInfo> out;
  for (auto& r : registry.All()) {
    if (r.group == group && r.version == version) out.push_back(r);
  }
  return out;
}

std::vector<std::string> Subresources(const ResourceInfo& r) {
  std::vector<std::string> subs;
  if (r.status_subresource) subs.push_back("status");
  if (r.group.empty() && r.plural == "pods") subs.push_back("log");
  return subs;
}

json ResourceEntry(const ResourceInfo& r) {
  json e = {{"name", r.plural},
            {"singularName", r.singular},
            {"namespaced", r.namespaced},
            {"kind", r.kind},
            {"verbs", r.verbs}};
  if (!r.short_names.empty()) e["shortNames"] = r.short_names;
  if (!r.categories.empty()) e["categories"] = r.categories;
  return e;
}

// The reversed-domain prefix the real server uses for schema names of a group.
std::string SchemaPrefix(const std::string& group, const std::string& version) {
  if (group.empty()) return "io.k8s.api.core." + version;
  static const std::vector<std::pair<std::string, std::string>> kBuiltin = {
      {"apps", "io.k8s.api.apps."},
      {"coordination.k8s.io", "io.k8s.api.coordination."},
      {"rbac.authorization.k8s.io", "io.k8s.api.rbac."},
      {"apiextensions.k8s.io", "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions."}};
  for (const auto& [g, p] : kBuiltin) {
    if (g == group) return p + version;
  }
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= group.size()) {
    size_t dot = group.find('.', i);
    if (dot == std::string::npos) dot = group.size();
    parts.push_back(group.substr(i, dot - i));
    i = dot + 1;
  }
  std::reverse(parts.begin(), parts.end());
  std::string out;
  for (const auto& p : parts) out += p + ".";
  return out + version;
}

json Gvk(const ResourceInfo& r, const std::string& kind) {
  return {{"group", r.group}, {"version", r.version}, {"kind", kind}};
}

json ObjectMetaSchema() {
  auto str = [](const char* d) { return json{{"type", "string"}, {"description", d}}; };
  json props = {
      {"name", str("Name must be unique within a namespace. Cannot be updated.")},
      {"generateName",
       str("GenerateName is an optional prefix, used by the server, to generate a unique name "
           "ONLY IF the Name field has not been provided.")},
      {"namespace", str("Namespace defines the space within which each name must be unique.")},
      {"uid", str("UID is the unique in time and space value for this object. Populated by the "
                  "system. Read-only.")},
      {"resourceVersion",
       str("An opaque value that represents the internal version of this object. Populated by "
           "the system. Read-only.")},
      {"generation",
       {{"type", "integer"},
        {"format", "int64"},
        {"description",
         "A sequence number representing a specific generation of the desired "
         "state. Populated by the system. Read-only."}}},
      {"creationTimestamp",
       {{"type", "string"},
        {"format", "date-time"},
        {"description",
         "CreationTimestamp is a timestamp representing the server time when "
         "this object was created."}}},
      {"deletionTimestamp",
       {{"type", "string"},
        {"format", "date-time"},
        {"description",
         "DeletionTimestamp is RFC 3339 date and time at which this resource "
         "will be deleted."}}},
      {"labels",
       {{"type", "object"},
        {"additionalProperties", {{"type", "string"}, {"default", ""}}},
        {"description",
         "Map of string keys and values that can be used to organize and "
         "categorize (scope and select) objects."}}},
      {"annotations",
       {{"type", "object"},
        {"additionalProperties", {{"type", "string"}, {"default", ""}}},
        {"description",
         "Annotations is an unstructured key value map stored with a resource "
         "that may be set by external tools to store and retrieve arbitrary "
         "metadata."}}},
      {"finalizers",
       {{"type", "array"},
        {"items", {{"type", "string"}, {"default", ""}}},
        {"x-kubernetes-list-type", "set"},
        {"x-kubernetes-patch-strategy", "merge"},
        {"description", "Must be empty before the object is deleted from the registry."}}},
      {"ownerReferences",
       {{"type", "array"},
        {"items", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}},
        {"x-kubernetes-patch-merge-key", "uid"},
        {"x-kubernetes-patch-strategy", "merge"},
        {"x-kubernetes-list-type", "map"},
        {"x-kubernetes-list-map-keys", {"uid"}},
        {"description", "List of objects depended by this object."}}}};
  return {{"type", "object"},
          {"description",
           "ObjectMeta is metadata that all persisted resources must have, which includes all "
           "objects users must create."},
          {"properties", props}};
}

json ListMetaSchema() {
  return {{"type", "object"},
          {"description", "ListMeta describes metadata that synthetic resources must have."},
          {"properties",
           {{"resourceVersion", {{"type", "string"}}},
            {"continue", {{"type", "string"}}},
            {"remainingItemCount", {{"type", "integer"}, {"format", "int64"}}}}}};
}

// The published form of int-or-string fields, which `kubectl explain` shows as
// <IntOrString>, as the real server does.
void PublishIntOrString(json& schema) {
  if (!schema.is_object()) return;
  if (schema.value("x-kubernetes-int-or-string", false) && !schema.contains("anyOf")) {
    schema["anyOf"] = json::array({{{"type", "integer"}}, {{"type", "string"}}});
  }
  for (const char* key : {"properties", "additionalProperties", "items"}) {
    if (!schema.contains(key)) continue;
    if (std::string(key) == "properties" && schema[key].is_object()) {
      for (auto& [k, v] : schema[key].items()) PublishIntOrString(v);
    } else {
      PublishIntOrString(schema[key]);
    }
  }
}

json KindSchema(const ResourceInfo& r) {
  json schema;
  if (r.custom && r.schema.is_object()) {
    schema = r.schema;
    PublishIntOrString(schema);
  } else {
    // Built-ins are served as opaque objects: no field schema beyond the envelope.
    schema = {{"type", "object"},
              {"description", r.kind + " (served by the spawnpoint API test server)."},
              {"properties",
               {{"spec", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}},
                {"status", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}}}}};
  }
  json& props = schema["properties"];
  if (!props.is_object()) props = json::object();
  props["apiVersion"] = {
      {"type", "string"},
      {"description",
       "APIVersion defines the versioned schema of this representation of an object. Servers "
       "should convert recognized schemas to the latest internal value, and may reject "
       "unrecognized values."}};
  props["kind"] = {{"type", "string"},
                   {"description",
                    "Kind is a string value representing the REST resource this object "
                    "represents. Servers may infer this from the endpoint the client submits "
                    "requests to. Cannot be updated. In CamelCase."}};
  props["metadata"] = {
      {"allOf", {{{"$ref", std::string("#/components/schemas/") + kObjectMetaRef}}}},
      {"default", json::object()},
      {"description",
       "Standard object's metadata. More info: "
       "https://git.k8s.io/community/contributors/devel/sig-architecture/"
       "api-conventions.md#metadata"}};
  schema["x-kubernetes-group-version-kind"] = json::array({Gvk(r, r.kind)});
  return schema;
}

json Parameter(const std::string& name, const std::string& in, const std::string& description) {
  return {{"name", name},
          {"in", in},
          {"description", description},
          {"schema", {{"type", "string"}, {"uniqueItems", true}}}};
}

json Operation(const ResourceInfo& r, const std::string& action, const std::string& ref,
               bool body) {
  json params = json::array();
  if (action == "post" || action == "put" || action == "patch") {
    params.push_back(Parameter("dryRun", "query",
                               "When present, indicates that modifications should not be "
                               "persisted."));
    params.push_back(Parameter("fieldManager", "query",
                               "fieldManager is a name associated with the actor or entity that "
                               "is making these changes."));
    params.push_back(Parameter("fieldValidation", "query",
                               "fieldValidation instructs the server on how to handle objects in "
                               "the request containing unknown or duplicate fields. Valid "
                               "values are: Ignore, Warn (the default), Strict."));
  }
  json op = {
      {"operationId", action + r.kind},
      {"x-kubernetes-action", action},
      {"x-kubernetes-group-version-kind", Gvk(r, r.kind)},
      {"parameters", params},
      {"responses",
       {{"200",
         {{"description", "OK"},
          {"content",
           {{"application/json", {{"schema", {{"$ref", "#/components/schemas/" + ref}}}}}}}}}}}};
  if (body) {
    op["requestBody"] = {{"content",
                          {{action == "patch" ? "application/merge-patch+json" : "application/json",
                            {{"schema", {{"$ref", "#/components/schemas/" + ref}}}}}}},
                         {"required", true}};
  }
  return op;
}

std::string Hex(size_t h) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%016zX", h);
  return buf;
}

}  // namespace

json VersionDocument() {
  return {{"major", "1"},
          {"minor", "32"},
          {"gitVersion", "v1.32.0-spawnpoint-test"},
          {"gitCommit", "0000000000000000000000000000000000000000"},
          {"gitTreeState", "clean"},
          {"buildDate", "2025-01-01T00:00:00Z"},
          {"goVersion", "go1.23.4"},
          {"compiler", "gc"},
          {"platform", "linux/amd64"}};
}

json CoreApiVersions(const std::string& server_address) {
  return {{"kind", "APIVersions"},
          {"versions", {"v1"}},
          {"serverAddressByClientCIDRs",
           {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", server_address}}}}};
}

json ApiGroupList(const Registry& registry) {
  json groups = json::array();
  for (const auto& [group, versions] : registry.Groups()) {
    json vs = json::array();
    for (const auto& v : versions)
      vs.push_back({{"groupVersion", group + "/" + v}, {"version", v}});
    groups.push_back({{"name", group}, {"versions", vs}, {"preferredVersion", vs[0]}});
  }
  return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}};
}

std::optional<json> ApiGroup(const Registry& registry, const std::string& group) {
  for (const auto& [g, versions] : registry.Groups()) {
    if (g != group) continue;
    json vs = json::array();
    for (const auto& v : versions) vs.push_back({{"groupVersion", g + "/" + v}, {"version", v}});
    return json{{"kind", "APIGroup"},
                {"apiVersion", "v1"},
                {"name", g},
                {"versions", vs},
                {"preferredVersion", vs[0]}};
  }
  return std::nullopt;
}

std::optional<json> ApiResourceList(const Registry& registry, const std::string& group,
                                    const std::string& version) {
  auto resources = InGroupVersion(registry, group, version);
  if (resources.empty()) return std::nullopt;
  json list = json::array();
  for (const auto& r : resources) {
    list.push_back(ResourceEntry(r));
    for (const auto& sub : Subresources(r)) {
      list.push_back({{"name", r.plural + "/" + sub},
                      {"singularName", ""},
                      {"namespaced", r.namespaced},
                      {"kind", r.kind},
                      {"verbs", sub == "log" ? json{"get"} : json{"get", "patch", "update"}}});
    }
  }
  return json{{"kind", "APIResourceList"},
              {"apiVersion", "v1"},
              {"groupVersion", group.empty() ? version : group + "/" + version},
              {"resources", list}};
}

json AggregatedDiscovery(const Registry& registry, bool core) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  if (core) {
    groups.push_back({"", {"v1"}});
  } else {
    groups = registry.Groups();
  }
  json items = json::array();
  for (const auto& [group, versions] : groups) {
    json vlist = json::array();
    for (const auto& v : versions) {
      json resources = json::array();
      for (const auto& r : InGroupVersion(registry, group, v)) {
        json e = {{"resource", r.plural},
                  {"responseKind", Gvk(r, r.kind)},
                  {"scope", r.namespaced ? "Namespaced" : "Cluster"},
                  {"singularResource", r.singular},
                  {"verbs", r.verbs}};
        if (!r.short_names.empty()) e["shortNames"] = r.short_names;
        if (!r.categories.empty()) e["categories"] = r.categories;
        json subs = json::array();
        for (const auto& sub : Subresources(r)) {
          subs.push_back({{"subresource", sub},
                          {"responseKind", Gvk(r, r.kind)},
                          {"verbs", sub == "log" ? json{"get"} : json{"get", "patch", "update"}}});
        }
        if (!subs.empty()) e["subresources"] = subs;
        resources.push_back(e);
      }
      vlist.push_back({{"version", v}, {"resources", resources}, {"freshness", "Current"}});
    }
    items.push_back(
        {{"metadata", {{"name", group}, {"creationTimestamp", nullptr}}}, {"versions", vlist}});
  }
  return {{"kind", "APIGroupDiscoveryList"},
          {"apiVersion", "apidiscovery.k8s.io/v2"},
          {"metadata", json::object()},
          {"items", items}};
}

std::optional<json> OpenApiV3GroupVersion(const Registry& registry, const std::string& gv_path) {
  std::string group, version;
  if (gv_path.rfind("api/", 0) == 0) {
    version = gv_path.substr(4);
  } else if (gv_path.rfind("apis/", 0) == 0) {
    std::string rest = gv_path.substr(5);
    size_t slash = rest.find('/');
    if (slash == std::string::npos) return std::nullopt;
    group = rest.substr(0, slash);
    version = rest.substr(slash + 1);
  } else {
    return std::nullopt;
  }
  auto resources = InGroupVersion(registry, group, version);
  if (resources.empty()) return std::nullopt;
  std::string base = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  json paths = json::object();
  json schemas = {{kObjectMetaRef, ObjectMetaSchema()}, {kListMetaRef, ListMetaSchema()}};
  for (const auto& r : resources) {
    std::string prefix = SchemaPrefix(group, version);
    std::string ref = prefix + "." + r.kind;
    std::string list_ref = prefix + "." + r.list_kind;
    schemas[ref] = KindSchema(r);
    schemas[list_ref] = {
        {"type", "object"},
        {"description", r.list_kind + " is a list of " + r.kind},
        {"required", {"items"}},
        {"properties",
         {{"apiVersion", {{"type", "string"}}},
          {"kind", {{"type", "string"}}},
          {"items", {{"type", "array"}, {"items", {{"$ref", "#/components/schemas/" + ref}}}}},
          {"metadata",
           {{"allOf", {{{"$ref", std::string("#/components/schemas/") + kListMetaRef}}}},
            {"default", json::object()}}}}},
        {"x-kubernetes-group-version-kind", json::array({Gvk(r, r.list_kind)})}};
    std::string coll =
        r.namespaced ? base + "/namespaces/{namespace}/" + r.plural : base + "/" + r.plural;
    paths[coll] = {{"get", Operation(r, "list", list_ref, false)},
                   {"post", Operation(r, "post", ref, true)}};
    paths[coll + "/{name}"] = {{"get", Operation(r, "get", ref, false)},
                               {"put", Operation(r, "put", ref, true)},
                               {"patch", Operation(r, "patch", ref, true)},
                               {"delete", Operation(r, "delete", ref, false)}};
    if (r.status_subresource) {
      paths[coll + "/{name}/status"] = {{"get", Operation(r, "get", ref, false)},
                                        {"put", Operation(r, "put", ref, true)},
                                        {"patch", Operation(r, "patch", ref, true)}};
    }
    if (r.namespaced)
      paths[base + "/" + r.plural] = {{"get", Operation(r, "list", list_ref, false)}};
  }
  return json{{"openapi", "3.0.0"},
              {"info", {{"title", "Kubernetes"}, {"version", "v1.32.0"}}},
              {"paths", paths},
              {"components", {{"schemas", schemas}}}};
}

json OpenApiV3Root(const Registry& registry) {
  json paths = json::object();
  std::vector<std::string> gvs = {"api/v1"};
  for (const auto& [group, versions] : registry.Groups()) {
    for (const auto& v : versions) gvs.push_back("apis/" + group + "/" + v);
  }
  for (const auto& gv : gvs) {
    auto doc = OpenApiV3GroupVersion(registry, gv);
    if (!doc) continue;
    // The hash lets clients cache a document until the registry changes it.
    std::string hash = Hex(std::hash<std::string>{}(doc->dump()));
    paths[gv] = {{"serverRelativeURL", "/openapi/v3/" + gv + "?hash=" + hash}};
  }
  return {{"paths", paths}};
}

json OpenApiV2(const Registry& registry) {
  json definitions = {{kObjectMetaRef, ObjectMetaSchema()}};
  for (const auto& r : registry.All()) {
    json s = KindSchema(r);
    s["properties"]["metadata"] = {{"$ref", std::string("#/definitions/") + kObjectMetaRef}};
    definitions[SchemaPrefix(r.group, r.version) + "." + r.kind] = s;
  }
  return {{"swagger", "2.0"},
          {"info", {{"title", "Kubernetes"}, {"version", "v1.32.0"}}},
          {"paths", json::object()},
          {"definitions", definitions}};
}

}  // namespace spawnpoint::kubetest
