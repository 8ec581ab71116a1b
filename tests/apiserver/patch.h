// The three patch formats kubectl and controllers send:
//   application/merge-patch+json           RFC 7386 JSON merge patch
//   application/strategic-merge-patch+json a merge patch whose lists of known built-in
//       fields merge by key (containers/env/volumes/... by name, volumeMounts by
//       mountPath, ports by containerPort or port, conditions by type, ownerReferences by
//       uid, finalizers as a set), honouring the `$patch: delete|replace` directives and
//       ignoring `$setElementOrder/...` and `$retainKeys` (order and retention are not
//       modelled). Lists of unknown fields are replaced, as for an unregistered type.
//   application/json-patch+json            RFC 6902 JSON patch
// Pure functions; thread-safe. Malformed patches throw ApiError (400 or 422 like the real
// server).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace spawnpoint::kubetest {

enum class PatchType { kMerge, kStrategic, kJsonPatch, kApply, kUnknown };

PatchType PatchTypeFromContentType(const std::string& content_type);

nlohmann::json ApplyMergePatch(const nlohmann::json& target, const nlohmann::json& patch);
nlohmann::json ApplyStrategicMergePatch(const nlohmann::json& target, const nlohmann::json& patch);
nlohmann::json ApplyJsonPatch(const nlohmann::json& target, const nlohmann::json& patch);

}  // namespace spawnpoint::kubetest
