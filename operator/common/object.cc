#include "operator/common/object.h"

#include <charconv>
#include <optional>

#include "operator/common/names.h"

namespace spawnpoint::op {
namespace {

int ParseNonNegative(const std::string& s) {
  int v = -1;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v < 0) return -1;
  return v;
}

const Json& Metadata(const Json& object) {
  static const Json empty = Json::object();
  if (!object.is_object()) return empty;
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : empty;
}

std::string MapValue(const Json& object, const char* map, const std::string& key) {
  const Json& meta = Metadata(object);
  auto m = meta.find(map);
  if (m == meta.end() || !m->is_object()) return "";
  auto v = m->find(key);
  return v != m->end() && v->is_string() ? v->get<std::string>() : "";
}

}  // namespace

std::string Str(const Json& object, const Json::json_pointer& pointer) {
  if (!object.contains(pointer)) return "";
  const Json& v = object.at(pointer);
  return v.is_string() ? v.get<std::string>() : "";
}

std::string NameOf(const Json& object) { return Metadata(object).value("name", ""); }
std::string NamespaceOf(const Json& object) { return Metadata(object).value("namespace", ""); }
std::string UidOf(const Json& object) { return Metadata(object).value("uid", ""); }

int64_t GenerationOf(const Json& object) {
  auto it = Metadata(object).find("generation");
  return it != Metadata(object).end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string LabelOf(const Json& object, const std::string& key) {
  return MapValue(object, "labels", key);
}
std::string AnnotationOf(const Json& object, const std::string& key) {
  return MapValue(object, "annotations", key);
}

bool IsTerminating(const Json& object) {
  auto it = Metadata(object).find("deletionTimestamp");
  return it != Metadata(object).end() && !it->is_null();
}

std::string PodPhase(const Json& pod) { return Str(pod, "/status/phase"_json_pointer); }

int NodeRankOf(const Json& pod) { return ParseNonNegative(LabelOf(pod, kNodeRankLabel)); }
int AttemptOf(const Json& pod) { return ParseNonNegative(LabelOf(pod, kAttemptLabel)); }

bool OfCurrentGang(const Json& job, const Json& pod) {
  const Json status = job.value("status", Json::object());
  auto number = [&](const char* key) -> std::optional<int> {
    if (!status.is_object() || !status.contains(key) || !status[key].is_number_integer()) {
      return std::nullopt;
    }
    return status[key].get<int>();
  };
  if (std::optional<int> gang = number("gangAttempt")) return AttemptOf(pod) >= *gang;
  return AttemptOf(pod) == number("restarts").value_or(0);
}

const Json* ContainerStatus(const Json& pod, const std::string& container) {
  if (!pod.contains("status")) return nullptr;
  auto it = pod["status"].find("containerStatuses");
  if (it == pod["status"].end() || !it->is_array()) return nullptr;
  for (const auto& cs : *it) {
    if (cs.is_object() && cs.value("name", "") == container) return &cs;
  }
  return nullptr;
}

std::string ControllingJobName(const Json& object) {
  auto refs = Metadata(object).find("ownerReferences");
  if (refs == Metadata(object).end() || !refs->is_array()) return "";
  for (const auto& ref : *refs) {
    if (ref.is_object() && ref.value("controller", false) &&
        ref.value("kind", "") == kTrainingJobKind) {
      return ref.value("name", "");
    }
  }
  return "";
}

const Json* FindCondition(const Json& object, const std::string& type) {
  const Json* status = object.contains("status") ? &object["status"] : nullptr;
  if (status == nullptr || !status->is_object() || !status->contains("conditions") ||
      !(*status)["conditions"].is_array()) {
    return nullptr;
  }
  for (const auto& c : (*status)["conditions"]) {
    if (c.is_object() && c.value("type", "") == type) return &c;
  }
  return nullptr;
}

}  // namespace spawnpoint::op
