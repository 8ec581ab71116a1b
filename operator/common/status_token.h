// Each TrainingJob's status token: the hex HMAC-SHA256 of the job's namespace, name and UID
// under the operator's key. The operator puts it in the job's Secret (JobSecretName), where the
// job's agents read it (--status-token-file), and sends it when it reads an agent's /status
// (utilisation/agent_status.h); the agents serve log lines, tracebacks and stacks only to
// readers that send it (agent/status/status_access.h). The operator never reads a Secret
// back: a restarted operator with the same key (--status-token-key-file, the chart's Secret)
// derives the same tokens, and another tenant, who cannot read the job's Secret, cannot.
//
// Thread-safe: immutable after construction.
#pragma once

#include <string>

#include "common/status.h"

namespace spawnpoint::op {

class StatusTokens {
 public:
  // The key is the file's bytes, without a trailing line end; at least 32 of them (the
  // chart's Secret holds 64 random characters).
  static StatusOr<StatusTokens> FromFile(const std::string& path);
  // 32 bytes from /dev/urandom: tokens change when the operator restarts.
  static StatusOr<StatusTokens> Random();

  explicit StatusTokens(std::string key) : key_(std::move(key)) {}

  // 64 lowercase hex characters; different for every (namespace, name, uid).
  std::string For(const std::string& ns, const std::string& name, const std::string& uid) const;

 private:
  std::string key_;
};

inline constexpr size_t kMinStatusTokenKeyBytes = 32;

}  // namespace spawnpoint::op
