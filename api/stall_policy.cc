#include "api/stall_policy.h"

#include <cmath>
#include <string>

#include "api/field_reader.h"

namespace spawnpoint::api {

const char* StallActionName(StallAction action) {
  return kStallActionNames[static_cast<size_t>(action)].data();
}

Status DecodeStallPolicy(FieldReader& reader, const Field& field, StallPolicy* policy) {
  if (!field.value) return Status::Ok();
  SP_RETURN_IF_ERROR(reader.CheckObject(*field.value, field.path,
                                        "the stalled and straggling rank settings", kStallFields));
  const nlohmann::json& s = *field.value;
  Field timeout = Get(s, field.path, "timeoutSeconds");
  if (timeout.value && timeout.value->is_string()) {
    if (*timeout.value != "auto") {
      return reader.Fail(timeout.path,
                         "must be an integer >= 1 or \"auto\", got " + Describe(*timeout.value));
    }
    policy->timeout_seconds = std::nullopt;
  } else if (timeout.value) {
    if (!timeout.value->is_number()) {
      return reader.WrongType(timeout, "an integer >= 1 or \"auto\"");
    }
    int seconds = 0;
    SP_RETURN_IF_ERROR(reader.ReadInt(timeout, 1, kIntMax, &seconds));
    policy->timeout_seconds = seconds;
  }
  SP_RETURN_IF_ERROR(reader.ReadInt(Get(s, field.path, "startupTimeoutSeconds"), 0, kIntMax,
                                    &policy->startup_timeout_seconds));
  SP_RETURN_IF_ERROR(
      reader.ReadEnum(Get(s, field.path, "action"), kStallActionNames, &policy->action));
  Field ratio = Get(s, field.path, "stragglerRatio");
  if (ratio.value) {
    if (!ratio.value->is_number()) return reader.WrongType(ratio, "a number > 1, such as 1.5");
    const double value = ratio.value->get<double>();
    if (!std::isfinite(value) || value <= 1.0 || value > 100.0) {
      return reader.Fail(ratio.path,
                         "must be a number > 1 and <= 100 (a rank this many times "
                         "slower than the job's median straggles), got " +
                             Describe(*ratio.value));
    }
    policy->straggler_ratio = value;
  }
  return Status::Ok();
}

nlohmann::json StallPolicyJson(const StallPolicy& p) {
  return {
      {"timeoutSeconds", p.timeout_seconds ? nlohmann::json(*p.timeout_seconds) : "auto"},
      {"startupTimeoutSeconds", p.startup_timeout_seconds},
      {"action", StallActionName(p.action)},
      {"stragglerRatio", p.straggler_ratio},
  };
}

}  // namespace spawnpoint::api
