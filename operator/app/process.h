// What both of spawnpoint-operator's processes (the operator, `status-watchdog`) do first.
// Not thread-safe: call from main before any thread starts.
#pragma once

#include <signal.h>

#include <string>

namespace spawnpoint::op {

// Blocks SIGTERM and SIGINT in this thread (and so in every thread started after), to be taken
// by one thread with sigwait(&returned set); ignores SIGPIPE.
sigset_t BlockStopSignals();

// Sets the log level from a --log-level value the flags accepted ("info" if unknown) and
// returns `identity`, or hostname_pid when it is empty.
std::string StartLogging(const std::string& log_level, const std::string& identity);

}  // namespace spawnpoint::op
