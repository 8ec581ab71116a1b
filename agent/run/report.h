// How the agent tells the world, line by line and file by file: its console lines, the
// --status-file document and the Kubernetes termination log. NodeAgent::Report() decides
// what to say; these only write it. Thread-safe (each call writes on its own).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "agent/cli/options.h"
#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::agent {

// "[spawnpoint] <line>" on stderr, in one write().
void Say(const std::string& line);

// The exit code for an error before anything started (agent/run/exit_codes.h): 2 for bad
// input (InvalidArgument), 1 for anything else.
int ExitCodeFor(const Status& status);
// Says "error: <message>" and returns ExitCodeFor(status).
int Fail(const Status& status);

// "1:02:03" (hours unpadded).
std::string FormatElapsed(Clock::Duration elapsed);

// Replaces the status file with `text` (a NodeStatus document, as /status serves it)
// atomically (write, then rename), so a reader never sees half of it. An error names the
// file and why; the old content stays.
Status WriteStatusFile(const std::string& path, const std::string& text);

// Kubernetes keeps 4096 bytes of a termination message; the newline and some slack aside.
inline constexpr size_t kTerminationMessageLimit = 4000;

// `message` as one line of JSON in at most `limit` bytes, always valid UTF-8 and one JSON
// object: when too long, "logTail" loses its oldest lines first, then "stack" its end, then
// "consequences" their last entries, then "line" and "message" their ends.
std::string FitTerminationMessage(const nlohmann::json& message, size_t limit);

// Writes `message` to the termination log when one is wanted: --termination-log given, or
// the default path exists (the kubelet creates it in pods), fitted to
// kTerminationMessageLimit (FitTerminationMessage).
void WriteTerminationLog(const AgentOptions& o, const nlohmann::json& message);

}  // namespace spawnpoint::agent
