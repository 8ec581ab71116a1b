#include "tests/apiserver/patch.h"

#include <algorithm>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {
namespace {

// The merge key of a list field of the built-in types, or "" for an atomic list. Lists of
// primitives that merge as sets return "$set".
std::string MergeKey(const std::string& field, const json& sample) {
  static const char* kByName[] = {"containers", "initContainers",   "ephemeralContainers", "env",
                                  "volumes",    "imagePullSecrets", "resourceClaims"};
  for (const char* f : kByName) {
    if (field == f) return "name";
  }
  if (field == "volumeMounts") return "mountPath";
  if (field == "volumeDevices") return "devicePath";
  if (field == "conditions") return "type";
  if (field == "ownerReferences") return "uid";
  if (field == "hostAliases") return "ip";
  if (field == "topologySpreadConstraints") return "topologyKey";
  if (field == "ports") {
    if (sample.is_object() && sample.contains("containerPort")) return "containerPort";
    return "port";
  }
  if (field == "finalizers") return "$set";
  return "";
}

json StrategicMerge(const json& target, const json& patch);

json MergeList(const std::string& field, const json& target, const json& patch) {
  // `$patch: replace` as an element replaces the whole list with the other elements.
  json elements = json::array();
  bool replace = false;
  for (const auto& e : patch) {
    if (e.is_object() && e.value("$patch", "") == "replace") {
      replace = true;
    } else {
      elements.push_back(e);
    }
  }
  if (replace) return elements;
  const json& sample = !elements.empty() ? elements[0] : (target.empty() ? json() : target[0]);
  std::string key = MergeKey(field, sample);
  if (key.empty() || !target.is_array()) {
    json out = json::array();
    for (const auto& e : elements) {
      if (!(e.is_object() && e.value("$patch", "") == "delete")) out.push_back(e);
    }
    return out;
  }
  json out = target;
  if (key == "$set") {
    for (const auto& e : elements) {
      if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    }
    return out;
  }
  for (const auto& e : elements) {
    if (!e.is_object() || !e.contains(key)) {
      out.push_back(e);
      continue;
    }
    auto it = std::find_if(out.begin(), out.end(), [&](const json& t) {
      return t.is_object() && t.contains(key) && t[key] == e[key];
    });
    bool del = e.value("$patch", "") == "delete";
    if (it == out.end()) {
      if (!del) out.push_back(StrategicMerge(json::object(), e));
    } else if (del) {
      out.erase(it);
    } else {
      *it = StrategicMerge(*it, e);
    }
  }
  return out;
}

json StrategicMerge(const json& target, const json& patch) {
  if (!patch.is_object()) return patch;
  if (patch.value("$patch", "") == "replace") {
    json copy = patch;
    copy.erase("$patch");
    return copy;
  }
  if (patch.value("$patch", "") == "delete") return nullptr;
  json out = target.is_object() ? target : json::object();
  for (const auto& [key, value] : patch.items()) {
    if (key == "$patch" || key == "$retainKeys" || key.rfind("$setElementOrder/", 0) == 0) {
      continue;
    }
    if (key.rfind("$deleteFromPrimitiveList/", 0) == 0) {
      std::string field = key.substr(std::string("$deleteFromPrimitiveList/").size());
      if (out.contains(field) && out[field].is_array() && value.is_array()) {
        json kept = json::array();
        for (const auto& e : out[field]) {
          if (std::find(value.begin(), value.end(), e) == value.end()) kept.push_back(e);
        }
        out[field] = kept;
      }
      continue;
    }
    if (value.is_null()) {
      out.erase(key);
    } else if (value.is_object()) {
      json merged = StrategicMerge(out.contains(key) ? out[key] : json::object(), value);
      if (merged.is_null()) {
        out.erase(key);
      } else {
        out[key] = merged;
      }
    } else if (value.is_array()) {
      out[key] = MergeList(key, out.contains(key) ? out[key] : json::array(), value);
    } else {
      out[key] = value;
    }
  }
  return out;
}

}  // namespace

PatchType PatchTypeFromContentType(const std::string& content_type) {
  std::string ct = content_type.substr(0, content_type.find(';'));
  if (ct == "application/merge-patch+json") return PatchType::kMerge;
  if (ct == "application/strategic-merge-patch+json") return PatchType::kStrategic;
  if (ct == "application/json-patch+json") return PatchType::kJsonPatch;
  if (ct == "application/apply-patch+yaml" || ct == "application/apply-patch+cbor") {
    return PatchType::kApply;
  }
  return PatchType::kUnknown;
}

json ApplyMergePatch(const json& target, const json& patch) {
  if (!patch.is_object()) throw BadRequestError("the patch must be a JSON object");
  json out = target;
  out.merge_patch(patch);
  return out;
}

json ApplyStrategicMergePatch(const json& target, const json& patch) {
  if (!patch.is_object()) throw BadRequestError("the patch must be a JSON object");
  return StrategicMerge(target, patch);
}

json ApplyJsonPatch(const json& target, const json& patch) {
  if (!patch.is_array()) {
    throw BadRequestError("the JSON patch must be an array of operations");
  }
  try {
    return target.patch(patch);
  } catch (const json::exception& e) {
    // The real server reports a failed operation (a missing path, a failed test) as 422.
    throw ApiError(422, "Invalid",
                   std::string("the server rejected our request due to an error "
                               "in our request: ") +
                       e.what());
  }
}

}  // namespace spawnpoint::kubetest
