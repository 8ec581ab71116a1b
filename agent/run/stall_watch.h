// StallWatch decides which ranks are stalled, from their progress records (issue 13): a
// rank that made no step for spec.stallPolicy.timeoutSeconds ("auto": the larger of 30 s
// and 10x the job's median step, once the job has made 20 steps), or, before its first
// step, for startupTimeoutSeconds (0: never). Pure: the caller reads the records and the
// clock (CLOCK_MONOTONIC ns, the records' own), so it is tested on simulated time. A rank
// is reported once per silence: again only after it has stepped. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "agent/progress/progress_file.h"
#include "api/stall_policy.h"

namespace spawnpoint::agent {

struct RankProgress {
  int rank = 0;
  progress::ProgressSnapshot snapshot;
  int64_t started_ns = 0;  // when the agent started the rank (CLOCK_MONOTONIC ns)
};

struct StalledRank {
  int rank = 0;
  uint64_t steps = 0;
  int64_t silent_ns = 0;  // since its last step, or since it started
  bool before_first_step = false;
};

class StallWatch {
 public:
  explicit StallWatch(const api::StallPolicy& policy) : policy_(policy) {}

  // The ranks that have just become stalled at `now_ns`, in rank order.
  std::vector<StalledRank> Check(const std::vector<RankProgress>& ranks, int64_t now_ns);

  // Counts `rank` as reported at `steps` (a peer named as waiting on the stalled one): it
  // is not reported until it steps again.
  void MarkReported(int rank, uint64_t steps);

  // The median of the ranks' recent step durations at the last Check (0: no step yet).
  double MedianStepSeconds() const { return median_step_s_; }
  // The timeout for ranks that have stepped, as of the last Check; nullopt while "auto"
  // waits for its 20 steps.
  std::optional<int64_t> TimeoutNs() const { return timeout_ns_; }

 private:
  const api::StallPolicy policy_;
  std::vector<uint64_t> reported_at_;  // per rank: the step count it was reported stalled at
  std::vector<bool> reported_;
  double median_step_s_ = 0;
  std::optional<int64_t> timeout_ns_;
};

// The median of every duration in `ranks`' recent steps, in seconds (0 for none; of an even
// count, the mean of the middle two, as api::Median).
double MedianStepSeconds(const std::vector<RankProgress>& ranks);

}  // namespace spawnpoint::agent
