// What a rank's last lines say about its failure, beyond the exit code: one table of
// patterns (the shim stopping the rank, GPU out of memory, collective timeouts and errors, a
// DataLoader worker killed, shared memory exhausted, a failed import, a port in use) and, for
// Python, the exception of the last traceback; the line it was read from is quoted. Patterns
// read what the program printed, never the source lines a traceback or a warning quotes.
// Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agent/supervisor/exit_cause.h"

namespace spawnpoint::agent {

// One row of the table: a line matching `pattern` (ECMAScript; and `also`, when set, on the
// same line) means `reason`. Rows are tried in order: the first that matches any line wins.
// Lines a Python traceback quotes (`  File "x.py", line 3, in f`, the source under it and its
// ^^^ marks) and the source line under a warning are never matched: "timeout" in a quoted
// `store = _create_c10d_store(..., timeout)` is no collective timeout.
struct CausePattern {
  ExitReason reason;
  const char* what;     // how the message says it: "GPU out of memory"
  const char* pattern;  // what a line must contain
  const char* also;     // nullptr, or what the same line must contain too
  const char* advice;   // nullptr, or what to do, appended to the message
};
std::span<const CausePattern> CausePatterns();

struct TailMatch {
  // A table row's reason, or kUserError for a Python exception no row names.
  ExitReason reason = ExitReason::kUserError;
  std::string line;       // the matching line, trimmed, at most kMaxQuotedLineBytes
  std::string exception;  // "RuntimeError" when `line` is a Python exception's
  std::string message;    // "GPU out of memory: \"CUDA error: out of memory\""
  std::string advice;     // what to do, when the row says: "raise spec.shmSize"
  int port = 0;           // kPortInUse: the port the line names; 0 when it names none
};
inline constexpr size_t kMaxQuotedLineBytes = 300;

// The cause `lines` (a rank's output, oldest first, valid UTF-8) name: the first row that
// matches, quoting its last matching line; else the exception line of the last Python
// traceback; else nullopt.
std::optional<TailMatch> MatchTail(const std::vector<std::string>& lines);

// A PortInUse match's message, naming who holds its port: `holders` as
// DescribePortHolders (agent/supervisor/port_holder.h) says it ("held by pid 4242
// (python3)"); nothing changes for another reason or an empty `holders`.
void AddPortHolders(TailMatch* match, const std::string& holders);

// Whether `line` begins a Python traceback ("Traceback (most recent call last):" at its
// start): what CPython prints for an uncaught exception before the interpreter finalizes.
bool StartsPythonTraceback(const std::string& line);

// A rank that began a Python traceback at most kRecentTraceback ago (CPython prints it, then
// finalizes, closing its connections while its peers already fail) is dying by itself; a stop
// of the other ranks waits for it at most kDyingWait, so its own failure is weighed
// (GangOptions::dying_wait, agent/run/gang_stop_check.h). kDyingWait is shorter than the gang
// coordinator's settling window (1 s); a finalization takes well under a second, twice that is
// left for a loaded machine.
inline constexpr std::chrono::milliseconds kDyingWait{500};
inline constexpr std::chrono::milliseconds kRecentTraceback{2000};

// The exit's cause refined by what the rank said: a rank that exited or crashed (UserError,
// Crashed) by itself takes the tail's reason and quotes its line; a cause from outside the
// rank (OOMKilled, Killed, Terminated, Stalled) or a SIGBUS stays, quoting a line only when
// it names the same reason.
ExitCause RefineWithTail(const ExitCause& exit, const ExitStatus& status,
                         const std::optional<TailMatch>& match);

// The cause among the failures of one attempt (in the order they were seen; not empty):
// a collective timeout or error yields to any other reason (it is what a rank's peers see
// when it dies, and their agents may see it before the dying rank's own agent does), then
// the earliest by failed_at_ms (unknown times last), then the first seen. The others, and
// the consequences they carried, become its consequences.
RankFailure PickRootCause(std::vector<RankFailure> failures);

}  // namespace spawnpoint::agent
