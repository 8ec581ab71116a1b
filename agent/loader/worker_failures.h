// How the pool client tells the trainer what went wrong with a worker: the lines and
// statuses for a death (with its exit record), a hang, a batch given up after repeated
// failures, and an error a worker reported. Pure functions; thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/loader/contract.h"
#include "common/status.h"

namespace spawnpoint::loader {

// "1, 2, 3" as "[1, 2, 3]", the first `limit` only, then how many in all.
std::string JoinIndices(const std::vector<int64_t>& v, size_t limit = 16);

// "; its last stderr lines:\n    <line>..." ("; it wrote nothing to stderr" if none).
std::string StderrTail(const WorkerExitRecord& record);

// Which restart counter a worker's end charges.
enum class RestartKind { kDied, kHung, kOom, kShm };

struct DeathReport {
  std::string line;  // "worker 1 (pid 7, incarnation 2) died: exit code 3 ..."
  std::string tail;  // StderrTail of the record, empty without one
  RestartKind kind = RestartKind::kDied;
};

// A worker's end, seen as EOF on its connection. `record` is its exit record if one
// appeared (else it was awaited for `record_wait` in `dir`); `hang_note` is set when the
// client killed it as hung (see HangNote).
DeathReport DescribeDeath(int worker, pid_t pid, const std::optional<WorkerExitRecord>& record,
                          const std::string& hang_note, const std::string& dir,
                          std::chrono::seconds record_wait);

// "hung: no batch in 0.8 s (building batch 9 of epoch 0); killed with SIGKILL", with
// `starvation` (HangClock::Note: what waiting for a CPU did not count) before "; killed".
std::string HangNote(std::chrono::milliseconds timeout, int64_t batch, int64_t epoch,
                     const std::string& starvation = "");

// "loader: batch 9 of epoch 0 (sample indices [...]) failed 3 times:\n  attempt 1: ..."
std::string GiveUpMessage(int64_t batch, int64_t epoch, const std::vector<int64_t>& indices,
                          const std::vector<std::string>& failures);

// The status for an Error message `body` from worker `who` ("worker 1 (pid 7)") about
// `batch` ("batch 3 of epoch 0", or empty). `probe_bytes` is the first batch's size the
// slots were sized from, nullopt when slot_bytes was given.
Status WorkerErrorStatus(const nlohmann::json& body, const std::string& who,
                         const std::string& batch, const std::string& dataset,
                         std::optional<size_t> probe_bytes);

}  // namespace spawnpoint::loader
