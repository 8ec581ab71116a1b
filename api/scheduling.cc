#include "api/scheduling.h"

#include <string>

#include "api/field_reader.h"

namespace spawnpoint::api {
namespace {

// A Kubernetes object name (RFC 1123 subdomain): DNS labels joined by '.', at most `max`
// characters.
bool IsSubdomain(std::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    std::string_view label = s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
    if (label.size() > 63 || !IsDnsLabel(label, /*first_may_be_digit=*/true)) return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

std::string NameRule(size_t max) {
  return "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, "
         "at most " +
         std::to_string(max) + " characters";
}

// A Kueue queue name travels as a label value (at most 63 characters).
constexpr size_t kKueueQueueMax = 63;
constexpr size_t kObjectNameMax = 253;

}  // namespace

const char* GangSchedulerName(GangScheduler gang) {
  return kGangSchedulerNames[static_cast<size_t>(gang)].data();
}

Status DecodeScheduling(FieldReader& reader, const Field& field, const Field& metadata_field,
                        SchedulingSpec* scheduling) {
  // The queue Kueue users write on the workload itself.
  Field label{nullptr, metadata_field.path / "labels" / kKueueQueueLabel};
  std::string label_queue;
  if (metadata_field.value && metadata_field.value->is_object()) {
    Field labels = Get(*metadata_field.value, metadata_field.path, "labels");
    if (labels.value && labels.value->is_object()) {
      label = Get(*labels.value, labels.path, kKueueQueueLabel);
      SP_RETURN_IF_ERROR(reader.ReadString(label, &label_queue));
    }
  }
  Field gang{nullptr, field.path / "gang"};
  Field queue{nullptr, field.path / "queue"};
  if (field.value) {
    SP_RETURN_IF_ERROR(reader.CheckObject(*field.value, field.path, "the gang scheduling settings",
                                          kSchedulingFields));
    const nlohmann::json& s = *field.value;
    gang = Get(s, field.path, "gang");
    SP_RETURN_IF_ERROR(reader.ReadEnum(gang, kGangSchedulerNames, &scheduling->gang));
    queue = Get(s, field.path, "queue");
    SP_RETURN_IF_ERROR(reader.ReadString(queue, &scheduling->queue));
    Field priority = Get(s, field.path, "priorityClassName");
    SP_RETURN_IF_ERROR(reader.ReadString(priority, &scheduling->priority_class_name));
    if (priority.value && !IsSubdomain(scheduling->priority_class_name, kObjectNameMax)) {
      return reader.Fail(priority.path,
                         "must be the name of a PriorityClass: " + NameRule(kObjectNameMax) +
                             "; got " + Quote(scheduling->priority_class_name));
    }
  }
  // The label alone queues the job in Kueue, as it does any workload.
  if (!gang.value && label.value) scheduling->gang = GangScheduler::kKueue;

  if (label.value && scheduling->gang != GangScheduler::kKueue) {
    return reader.Fail(label.path, std::string("the label ") + kKueueQueueLabel +
                                       " queues the job in Kueue, but spec.scheduling.gang is " +
                                       Quote(GangSchedulerName(scheduling->gang)) +
                                       "; remove the label, or set gang to \"kueue\"");
  }
  if (queue.value && scheduling->gang == GangScheduler::kNone) {
    return reader.Fail(queue.path,
                       "is used only by a gang scheduler, and spec.scheduling.gang is \"none\"; "
                       "set gang to \"volcano\" or \"kueue\", or remove the queue");
  }
  if (scheduling->gang == GangScheduler::kKueue) {
    if (queue.value && label.value && scheduling->queue != label_queue) {
      return reader.Fail(queue.path, Quote(scheduling->queue) + " differs from the label " +
                                         kKueueQueueLabel + " " + Quote(label_queue) +
                                         " on the job; give the LocalQueue once, or the same "
                                         "name in both");
    }
    if (!queue.value && label.value) scheduling->queue = label_queue;
    if (!queue.value && !label.value) {
      return reader.Fail(gang.value ? gang.path : field.path,
                         std::string("\"kueue\" needs a LocalQueue of the job's namespace: set "
                                     "spec.scheduling.queue, or the label ") +
                             kKueueQueueLabel + " on metadata.labels");
    }
    const Field& named = queue.value ? queue : label;
    if (!IsSubdomain(scheduling->queue, kKueueQueueMax)) {
      return reader.Fail(
          named.path, "must be the name of a LocalQueue: " + NameRule(kKueueQueueMax) + "; got " +
                          Quote(scheduling->queue));
    }
  }
  if (scheduling->gang == GangScheduler::kVolcano) {
    if (!queue.value) scheduling->queue = kVolcanoDefaultQueue;
    if (!IsSubdomain(scheduling->queue, kObjectNameMax)) {
      return reader.Fail(queue.path,
                         "must be the name of a Volcano Queue: " + NameRule(kObjectNameMax) +
                             "; got " + Quote(scheduling->queue));
    }
  }
  return Status::Ok();
}

nlohmann::json SchedulingJson(const SchedulingSpec& s) {
  nlohmann::json out = {{"gang", GangSchedulerName(s.gang)}};
  if (!s.queue.empty()) out["queue"] = s.queue;
  if (!s.priority_class_name.empty()) out["priorityClassName"] = s.priority_class_name;
  return out;
}

}  // namespace spawnpoint::api
