// Helpers for the policy tests: pods as the kubelet reports them, a fixed wall time.
#pragma once

#include <gmock/gmock.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "operator/common/names.h"
#include "operator/common/wall_clock.h"

namespace spawnpoint::op::testing {

using nlohmann::json;

inline const WallTime kT0 = WallTime(std::chrono::seconds(1'714'557'600));  // 2024-05-01T10:00:00Z

inline json Pod(int node, const std::string& phase, json status_extra = json::object()) {
  json pod = {{"metadata",
               {{"name", "job-node-" + std::to_string(node)},
                {"labels", {{kNodeRankLabel, std::to_string(node)}, {kAttemptLabel, "0"}}},
                {"creationTimestamp", "2024-05-01T10:00:00Z"}}},
              {"status", {{"phase", phase}}}};
  pod["status"].update(status_extra);
  return pod;
}

inline json Terminated(int code, const std::string& reason, const std::string& message = "",
                       const std::string& finished = "2024-05-01T10:00:05Z") {
  json t = {{"exitCode", code}, {"reason", reason}, {"finishedAt", finished}};
  if (!message.empty()) t["message"] = message;
  return {
      {"containerStatuses", json::array({{{"name", "trainer"}, {"state", {{"terminated", t}}}}})}};
}

}  // namespace spawnpoint::op::testing

namespace spawnpoint::op::policy_test {

// What every policy test uses, in one line: `using namespace policy_test;`.
using nlohmann::json;
using std::chrono::seconds;
using ::testing::HasSubstr;
using testing::kT0;
using testing::Pod;
using testing::Terminated;

}  // namespace spawnpoint::op::policy_test
