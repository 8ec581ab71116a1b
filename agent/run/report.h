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

// The exit code for an error before anything started: 2 bad input, 1 anything else.
int ExitCodeFor(const Status& status);
// Says "error: <message>" and returns ExitCodeFor(status).
int Fail(const Status& status);

// "1:02:03" (hours unpadded).
std::string FormatElapsed(Clock::Duration elapsed);

// Replaces the status file with `document` atomically (write, then rename), so a reader
// never sees half of it; warns when it cannot.
void WriteStatusFile(const std::string& path, const nlohmann::json& document);

// Writes `message` (cut to 4000 bytes: Kubernetes keeps 4096) to the termination log when
// one is wanted: --termination-log given, or the default path exists (the kubelet creates
// it in pods).
void WriteTerminationLog(const AgentOptions& o, const nlohmann::json& message);

}  // namespace spawnpoint::agent
