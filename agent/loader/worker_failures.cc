#include "agent/loader/worker_failures.h"

#include <cstdio>

#include "common/bytes.h"

namespace spawnpoint::loader {

std::string JoinIndices(const std::vector<int64_t>& v, size_t limit) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s + "]";
}

std::string StderrTail(const WorkerExitRecord& record) {
  if (record.stderr_tail.empty()) return "; it wrote nothing to stderr";
  std::string tail = "; its last stderr lines:";
  for (const std::string& l : record.stderr_tail) tail += "\n    " + l;
  return tail;
}

DeathReport DescribeDeath(int worker, pid_t pid, const std::optional<WorkerExitRecord>& record,
                          const std::string& hang_note, const std::string& dir,
                          std::chrono::seconds record_wait) {
  DeathReport r;
  std::string who = "worker " + std::to_string(worker) + " (pid " + std::to_string(pid);
  if (record) who += ", incarnation " + std::to_string(record->incarnation);
  who += ")";
  if (!hang_note.empty()) {
    r.line = who + " " + hang_note;
    r.kind = RestartKind::kHung;
  } else if (record) {
    r.line = who + " died: " + record->Describe();
    switch (record->cause.reason) {
      case agent::ExitReason::kOomKilled:
        r.kind = RestartKind::kOom;
        break;
      case agent::ExitReason::kShmExhausted:
        r.kind = RestartKind::kShm;
        break;
      default:
        r.kind = RestartKind::kDied;
    }
  } else {
    r.line = who + " closed its connection, and no exit record appeared in " + dir + " within " +
             std::to_string(record_wait.count()) + " s";
  }
  if (record) r.tail = StderrTail(*record);
  return r;
}

std::string HangNote(std::chrono::milliseconds timeout, int64_t batch, int64_t epoch,
                     const std::string& starvation) {
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g", std::chrono::duration<double>(timeout).count());
  return std::string("hung: no batch in ") + secs + " s (building batch " + std::to_string(batch) +
         " of epoch " + std::to_string(epoch) + ")" + starvation + "; killed with SIGKILL";
}

std::string GiveUpMessage(int64_t batch, int64_t epoch, const std::vector<int64_t>& indices,
                          const std::vector<std::string>& failures) {
  std::string msg = "loader: batch " + std::to_string(batch) + " of epoch " +
                    std::to_string(epoch) + " (sample indices " + JoinIndices(indices) +
                    ") failed " + std::to_string(failures.size()) + " times:";
  for (size_t i = 0; i < failures.size(); ++i) {
    msg += "\n  attempt " + std::to_string(i + 1) + ": " + failures[i];
  }
  return msg;
}

Status WorkerErrorStatus(const nlohmann::json& body, const std::string& who,
                         const std::string& batch, const std::string& dataset,
                         std::optional<size_t> probe_bytes) {
  const std::string kind = body.value("kind", "");
  const std::string message = body.value("message", "");
  if (kind == "dataset") {
    return Internal("loader: dataset \"" + dataset + "\" failed on sample index " +
                    std::to_string(body.value("index", int64_t{-1})) + " (" + batch + ", on " +
                    who + "): " + message);
  }
  if (kind == "slot") {
    const size_t need = body.value("need", size_t{0});
    const size_t have = body.value("have", size_t{0});
    std::string origin =
        !probe_bytes ? std::string("set by slot_bytes")
                     : "sized from the first batch (" + FormatBytes(*probe_bytes) + ") + 25 %";
    return FailedPrecondition("loader: " + batch + " needs " + FormatBytes(need) + " (" +
                              std::to_string(need) + " bytes) but a shared-memory slot holds " +
                              FormatBytes(have) + " (" + origin +
                              "); set LoaderOptions::slot_bytes or SPAWNPOINT_LOADER_SLOT_BYTES "
                              "to at least " +
                              std::to_string(need));
  }
  if (kind == "configure") {
    return FailedPrecondition("loader: " + who + " cannot serve dataset \"" + dataset +
                              "\": " + message);
  }
  return Internal("loader: " + who + " reported a " + kind + " error" +
                  (batch.empty() ? "" : " on " + batch) + ": " + message);
}

}  // namespace spawnpoint::loader
