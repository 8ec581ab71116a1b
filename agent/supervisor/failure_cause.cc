#include "agent/supervisor/failure_cause.h"

#include <array>
#include <cstdint>
#include <regex>
#include <tuple>

#include "common/text.h"

namespace spawnpoint::agent {
namespace {

// The table. Order matters where lines name two things: a worker killed by a bus error is
// shared memory, a gloo timeout is a timeout before it is a gloo error. The shim's own stop
// comes first: it is why the rank exited, whatever it printed before.
constexpr CausePattern kPatterns[] = {
    // agent/python/spawnpoint_rank/_report.py's fatal(): the shim ended the rank itself.
    {ExitReason::kUserError, "the shim stopped the rank", R"(^spawnpoint-shim: fatal: )", nullptr,
     nullptr},
    {ExitReason::kGpuOutOfMemory, "GPU out of memory",
     R"((CUDA|HIP)( error)?:? out of memory|OutOfMemoryError|hipErrorOutOfMemory|)"
     R"(cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED)",
     nullptr, "lower the batch size or the model's memory"},
    {ExitReason::kShmExhausted, "shared memory exhausted",
     R"([Bb]us error|insufficient shared memory)", nullptr, "raise spec.shmSize"},
    {ExitReason::kShmExhausted, "shared memory exhausted", R"(No space left on device)",
     R"(/dev/shm|torch_\d+_|shared memory)", "raise spec.shmSize"},
    // spawnpoint's own loader (agent/loader/shm_ring.cc): its ring found no room.
    {ExitReason::kShmExhausted, "shared memory exhausted",
     R"(shared-memory ring needs .* which has .* free|reserving the ring failed \(ENOSPC\))",
     nullptr, "raise spec.shmSize"},
    {ExitReason::kLoaderWorkerKilled, "a DataLoader worker died",
     R"(DataLoader worker \(pid(\(s\))? [^)]*\) (is killed by signal|exited unexpectedly))",
     nullptr, "its own memory limit or a crash in the dataset code are the usual causes"},
    // EADDRINUSE in c10d's words (torch 1.13-2.3: "failed to bind to [::]:29500 (errno: 98 -
    // Address already in use)"; 2.4+ on libuv: "port: 29500, ... name: EADDRINUSE, message:
    // address already in use"), gloo's and NCCL's ("bind: Address already in use"), Python's
    // ("OSError: [Errno 98] Address already in use").
    {ExitReason::kPortInUse, "port in use", R"([Aa]ddress already in use|EADDRINUSE)", nullptr,
     "another process on this node listens on it: stop it, or move to a free port "
     "(spec.rendezvous.port or --master-port for the job's own; a script that sets "
     "MASTER_PORT or a port of its own must change it)"},
    {ExitReason::kCollectiveTimeout, "a collective timed out",
     R"(Watchdog caught collective operation timeout|[Tt]imed out waiting \d+ ?ms for|)"
     R"(collective operation timeout)",
     nullptr, nullptr},
    {ExitReason::kCollectiveTimeout, "a collective timed out", R"([Tt]imed? ?out)",
     R"(NCCL|[Gg]loo|ProcessGroup|DistStoreError|c10d)", nullptr},
    {ExitReason::kCollectiveError, "a collective failed",
     R"(NCCL error|nccl(Remote|System|Internal|UnhandledCuda|InvalidUsage)Error|)"
     R"(Dist(Backend|Network)Error|gloo/transport|ProcessGroup(Gloo|NCCL).*[Ee]rror)",
     nullptr, nullptr},
    {ExitReason::kCollectiveError, "a collective failed",
     R"([Cc]onnection (closed|reset) by peer|[Bb]roken pipe|[Cc]onnection refused)",
     R"(NCCL|[Gg]loo|ProcessGroup|c10d)", nullptr},
    {ExitReason::kImportError, "an import failed",
     R"(^(ModuleNotFoundError|ImportError)\b|error while loading shared libraries)", nullptr,
     nullptr},
};

struct Compiled {
  std::regex pattern;
  std::optional<std::regex> also;
};

const std::vector<Compiled>& CompiledPatterns() {
  static const std::vector<Compiled>* compiled = [] {
    auto* out = new std::vector<Compiled>;
    for (const CausePattern& p : kPatterns) {
      Compiled c{std::regex(p.pattern), std::nullopt};
      if (p.also) c.also = std::regex(p.also);
      out->push_back(std::move(c));
    }
    return out;
  }();
  return *compiled;
}

std::string Trim(const std::string& line) {
  const size_t b = line.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = line.find_last_not_of(" \t\r");
  return line.substr(b, e - b + 1);
}

std::string Quoted(const std::string& line) {
  return KeepStart(ValidUtf8(Trim(line)), kMaxQuotedLineBytes, "...");
}

// "RuntimeError" for "RuntimeError: boom" or "torch.OutOfMemoryError: ...", "" for a line
// that does not start with a dotted name followed by ": " or its end.
std::string ExceptionType(const std::string& line) {
  static const std::regex kException(R"(^([A-Za-z_][\w.]*)(: |:$|$))");
  std::smatch m;
  if (!std::regex_search(line, m, kException)) return "";
  const std::string type = m[1].str();
  // A bare word ("Killed") is not an exception; a dotted name or a conventional suffix is.
  static const std::regex kLooksLike(R"((Error|Exception|Interrupt|Exit|Failure)$|\.)");
  return std::regex_search(type, kLooksLike) ? type : "";
}

// Which of `lines` a program quoted rather than said: a traceback's frame lines
// (`  File "x.py", line 3, in f`, also inside an exception group's `  | ` margin), the lines
// indented under them (the source and its ^^^/~~~ marks), and the source line that
// warnings.showwarning prints under "x.py:3: UserWarning: ...".
std::vector<bool> QuotedSource(const std::vector<std::string>& lines) {
  static const std::regex kFrame(R"(^([ \t|+]*)File "[^"]*", line \d+)");
  static const std::regex kWarning(R"(^\S.*:\d+: \w*Warning: )");
  std::vector<bool> quoted(lines.size(), false);
  std::string frame_margin;  // what precedes "File" on the last frame line; "" after none
  bool in_frame = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    std::smatch m;
    if (std::regex_search(l, m, kFrame)) {
      quoted[i] = true;
      frame_margin = m[1].str();
      in_frame = true;
      continue;
    }
    // Under a frame: its margin, then two more spaces at least.
    const size_t n = frame_margin.size();
    if (in_frame && l.size() > n + 2 && l.compare(0, n, frame_margin) == 0 && l[n] == ' ' &&
        l[n + 1] == ' ') {
      quoted[i] = true;
      continue;
    }
    in_frame = false;
    if (i > 0 && !quoted[i - 1] && std::regex_search(lines[i - 1], kWarning) &&
        l.rfind("  ", 0) == 0) {
      quoted[i] = true;
    }
  }
  return quoted;
}

// The port a PortInUse line names: "bind to [::]:29500", "port: 29500"; 0 if none.
int PortNamed(const std::string& line) {
  static const std::regex kBindTo(R"(bind to \S*:(\d{1,5})\b)");
  static const std::regex kPort(R"(\bport:? (\d{1,5})\b)");
  std::smatch m;
  if (!std::regex_search(line, m, kBindTo) && !std::regex_search(line, m, kPort)) return 0;
  const int port = std::stoi(m[1].str());
  return port > 0 && port <= 65535 ? port : 0;
}

// The exception line of the last traceback: the first unindented line after its header.
std::optional<std::string> LastTracebackException(const std::vector<std::string>& lines) {
  for (size_t i = lines.size(); i-- > 0;) {
    if (!StartsPythonTraceback(lines[i])) continue;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      const std::string& l = lines[j];
      if (l.empty() || l[0] == ' ' || l[0] == '\t') continue;
      return l;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::span<const CausePattern> CausePatterns() { return kPatterns; }

bool StartsPythonTraceback(const std::string& line) {
  return line.rfind("Traceback (most recent call last):", 0) == 0;
}

std::optional<TailMatch> MatchTail(const std::vector<std::string>& lines) {
  const std::vector<Compiled>& compiled = CompiledPatterns();
  const std::vector<bool> quoted = QuotedSource(lines);
  for (size_t row = 0; row < compiled.size(); ++row) {
    for (size_t i = lines.size(); i-- > 0;) {
      if (quoted[i]) continue;
      const std::string line = Trim(lines[i]);
      if (!std::regex_search(line, compiled[row].pattern)) continue;
      if (compiled[row].also && !std::regex_search(line, *compiled[row].also)) continue;
      TailMatch m;
      m.reason = kPatterns[row].reason;
      m.line = Quoted(line);
      m.exception = ExceptionType(line);
      m.message = std::string(kPatterns[row].what) + ": \"" + m.line + "\"";
      if (kPatterns[row].advice) m.advice = kPatterns[row].advice;
      if (m.reason == ExitReason::kPortInUse) {
        m.port = PortNamed(line);
        if (m.port > 0) {
          m.message = std::string(kPatterns[row].what) + ": port " + std::to_string(m.port) +
                      ": \"" + m.line + "\"";
        }
      }
      return m;
    }
  }
  if (std::optional<std::string> line = LastTracebackException(lines)) {
    TailMatch m;
    m.reason = ExitReason::kUserError;
    m.line = Quoted(*line);
    m.exception = ExceptionType(m.line);
    m.message = "uncaught exception: \"" + m.line + "\"";
    return m;
  }
  return std::nullopt;
}

void AddPortHolders(TailMatch* match, const std::string& holders) {
  if (match->reason != ExitReason::kPortInUse || match->port <= 0 || holders.empty()) return;
  const std::string port = ": port " + std::to_string(match->port);
  const size_t at = match->message.find(port);
  if (at == std::string::npos) return;
  match->message.insert(at + port.size(), ", " + holders);
}

ExitCause RefineWithTail(const ExitCause& exit, const ExitStatus& status,
                         const std::optional<TailMatch>& match) {
  if (!match) return exit;
  ExitCause out = exit;
  if (exit.reason == ExitReason::kUserError || exit.reason == ExitReason::kCrashed) {
    out.reason = match->reason;
    out.message = match->message;
    if (status.signal != 0) {
      out.message += " (then " + SignalName(status.signal) + ")";
    } else {
      out.message += " (exit code " + std::to_string(status.exit_code) + ")";
    }
    if (!match->advice.empty()) out.message += ": " + match->advice;
  } else if (match->reason != exit.reason) {
    return exit;
  }
  out.line = match->line;
  out.exception = match->exception;
  return out;
}

RankFailure PickRootCause(std::vector<RankFailure> failures) {
  auto key = [&](size_t i) {
    const RankFailure& f = failures[i];
    return std::make_tuple(IsCollectiveReason(f.cause.reason),
                           f.failed_at_ms > 0 ? f.failed_at_ms : INT64_MAX, i);
  };
  size_t root = 0;
  for (size_t i = 1; i < failures.size(); ++i) {
    if (key(i) < key(root)) root = i;
  }
  RankFailure out = failures[root];
  // Each rank's failure once: the agents of a gang each report the gang's cause and its
  // consequences (`agent run` on local nodes weighs all of them again).
  auto same = [](const PeerFailure& a, const PeerFailure& b) {
    return a.rank == b.rank && a.node_rank == b.node_rank && a.reason == b.reason;
  };
  const PeerFailure root_as_peer{out.rank, out.node_rank, out.status.ShellCode(),
                                 ExitReasonName(out.cause.reason), out.cause.line};
  auto add = [&](const PeerFailure& p) {
    if (same(p, root_as_peer)) return;
    for (const PeerFailure& q : out.consequences) {
      if (same(p, q)) return;
    }
    out.consequences.push_back(p);
  };
  for (size_t i = 0; i < failures.size(); ++i) {
    if (i == root) continue;
    const RankFailure& f = failures[i];
    add(PeerFailure{f.rank, f.node_rank, f.status.ShellCode(), ExitReasonName(f.cause.reason),
                    f.cause.line});
    for (const PeerFailure& p : f.consequences) add(p);
  }
  return out;
}

}  // namespace spawnpoint::agent
