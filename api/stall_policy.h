// spec.stallPolicy: when a rank that makes no training step is stalled, when one that is
// slower than the others is a straggler, and what the job does about it (issue 13). The
// agent applies it (agent/run/stall_watch.h); the operator reports it. Plain data and a
// decoder; thread-compatible.
#pragma once

#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace spawnpoint::api {

class FieldReader;  // api/field_reader.h, internal to api/
struct Field;

enum class StallAction { kReport, kRestart, kFail };

struct StallPolicy {
  // A rank silent this long after a step is stalled. nullopt ("auto"): from the first step
  // on, a rank that makes no step, uses no CPU and waits in no collective while a peer has
  // waited kPeerWaitSeconds for it in one; and, once the job has made kAutoArmSteps steps,
  // one silent for the larger of 30 s and 10x the job's median step.
  std::optional<int> timeout_seconds;
  // A rank that has made no step this long after it started is stalled; 0: never.
  int startup_timeout_seconds = 0;
  StallAction action = StallAction::kReport;
  // A rank whose step median exceeds the job's by this ratio for a whole window straggles.
  double straggler_ratio = 1.5;

  static constexpr int kAutoFloorSeconds = 30;
  static constexpr int kAutoMedianFactor = 10;
  static constexpr int kAutoArmSteps = 20;
  static constexpr int kPeerWaitSeconds = 30;
};

inline constexpr std::string_view kStallFields[] = {"timeoutSeconds", "startupTimeoutSeconds",
                                                    "action", "stragglerRatio"};
inline constexpr std::string_view kStallActionNames[] = {"Report", "Restart", "Fail"};

const char* StallActionName(StallAction action);

// Decodes spec.stallPolicy (absent: the defaults) with `reader`'s located errors.
Status DecodeStallPolicy(FieldReader& reader, const Field& field, StallPolicy* policy);
// The policy as the API spells it, defaults included ("auto" for timeoutSeconds).
nlohmann::json StallPolicyJson(const StallPolicy& policy);

}  // namespace spawnpoint::api
