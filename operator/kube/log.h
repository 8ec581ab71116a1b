// Where the Kubernetes client library reports what it does (retries, watch restarts,
// relists, leadership changes). A Logger is a plain callback so the operator decides the
// sink; messages never contain credentials. Callbacks may be invoked from any thread.
#pragma once

#include <functional>
#include <string>

namespace spawnpoint::kube {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

using Logger = std::function<void(LogLevel level, const std::string& message)>;

// Writes warnings and errors to stderr with a "[kube]" prefix; drops the rest.
Logger StderrLogger();

// Discards everything.
Logger NullLogger();

}  // namespace spawnpoint::kube
