// What the test server knows about each resource it serves: the built-in ones the project
// uses (namespaces, nodes, pods, services, events, configmaps, secrets, serviceaccounts,
// leases, CRDs, and the kinds the Helm chart applies: deployments and RBAC objects), plus
// one entry per served version of every established CustomResourceDefinition.
//
// Thread-safety: Registry is internally synchronised; lookups return copies, so a caller
// keeps a consistent ResourceInfo even if the CRD changes meanwhile.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {

using json = nlohmann::json;

struct ResourceInfo {
  std::string group;  // "" for the core group
  std::string version;
  std::string plural;
  std::string singular;
  std::string kind;
  std::string list_kind;
  bool namespaced = true;
  std::vector<std::string> verbs;
  std::vector<std::string> short_names;
  std::vector<std::string> categories;
  bool status_subresource = false;
  bool has_generation = false;               // metadata.generation is maintained
  bool allow_unconditional_update = true;    // PUT without resourceVersion
  std::vector<std::string> field_selectors;  // what fieldSelector may name
  // Custom resources only.
  bool custom = false;
  std::string crd_name;
  json schema;           // openAPIV3Schema, or null
  json printer_columns;  // additionalPrinterColumns, or null
  std::string storage_version;

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
  // All versions of a resource share one storage: "<group>/<plural>".
  std::string storage_key() const { return group + "/" + plural; }
  std::string qualified_resource() const { return group.empty() ? plural : plural + "." + group; }
};

class Registry {
 public:
  Registry();

  std::optional<ResourceInfo> Find(const std::string& group, const std::string& version,
                                   const std::string& plural) const;
  // Any served version of the resource (the storage version first, for CRs).
  std::optional<ResourceInfo> FindAnyVersion(const std::string& group,
                                             const std::string& plural) const;
  std::optional<ResourceInfo> FindByKind(const std::string& api_version,
                                         const std::string& kind) const;
  std::vector<ResourceInfo> All() const;
  // Groups in discovery order (core "" excluded), with their versions, preferred first.
  std::vector<std::pair<std::string, std::vector<std::string>>> Groups() const;

  // Registers (or re-registers) every served version of a CRD that passed CheckCrd().
  void RegisterCrd(const json& crd);
  void UnregisterCrd(const std::string& crd_name);
  // Bumped on every registry change, so discovery documents can carry a fresh hash.
  uint64_t generation() const;

 private:
  mutable std::mutex mu_;
  std::vector<ResourceInfo> resources_;
  uint64_t generation_ = 1;
};

// Checks a CRD for what the server needs to serve it (names, group, versions, scope).
std::vector<FieldError> CheckCrd(const json& crd);

}  // namespace spawnpoint::kubetest
