// Who reads what of /status. The document names the failing rank's log lines, its traceback
// and the source line it failed on, and a stalled rank's stack: on a shared cluster another
// tenant's pod must not read them. They are served only to a reader that sends the job's
// status token (`Authorization: Bearer TOKEN`: the operator, which derives each job's token,
// operator/common/status_token.h) or that connects from the pod's own loopback (its
// containers, `kubectl port-forward`, whose user may read the pod anyway); everyone else gets
// WithoutLogs() of it, which keeps every number and state the dashboards and the operator's
// utilisation need. docs/status.md, "Who reads what".
//
// Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "metrics/server.h"

namespace spawnpoint::agent {

// True when `request` may read the whole document: from loopback, or with
// "Bearer <token>" (compared in constant time) when `token` is not empty.
bool MayReadLogs(const std::string& token, const metrics::HttpRequest& request);

// `doc` (a /status document) without log lines: lastFailure and its consequences keep only
// rank, localRank, nodeRank, exitCode, reason, signal, retryable, failedAt and time (the
// message quotes a log line, so it goes too); stall keeps rank, pod, silentSeconds,
// medianStepSeconds, beforeFirstStep and waiting (not its stack, top frame or message).
// Adds "redacted": what was left out and how to read it.
nlohmann::json WithoutLogs(const nlohmann::json& doc);

// The token in `path` (its first line, without the line end), for --status-token-file.
// An empty path is no token. A missing file is no token either (a Secret made by an older
// operator has no such key), with `*note` saying so; an unreadable or empty one is an error.
StatusOr<std::string> ReadStatusToken(const std::string& path, std::string* note);

}  // namespace spawnpoint::agent
