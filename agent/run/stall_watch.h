// StallWatch decides which ranks are stalled, from their progress records (issue 13): a
// rank that made no step for spec.stallPolicy.timeoutSeconds ("auto": the larger of 30 s
// and 10x the job's median step, once the job has made 20 steps), or, before its first
// step, for startupTimeoutSeconds (0: never). Under "auto" also from the first step on, by
// what the ranks do rather than by step counts (issue 39): a rank is stalled when a peer has
// waited for it in a collective for kPeerWaitSeconds while it made no step, waits in no
// collective, and used almost no CPU (its loader workers' included) over that time; a rank
// at work, however slow its step, is never named so. Pure: the caller reads the records,
// the CPU times and the clock (CLOCK_MONOTONIC ns, the records' own), so it is tested on
// simulated time. A rank is reported once per silence: again only after it has stepped.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "agent/progress/progress_file.h"
#include "api/stall_policy.h"

namespace spawnpoint::agent {

struct RankProgress {
  int rank = 0;
  progress::ProgressSnapshot snapshot;
  int64_t started_ns = 0;  // when the agent started the rank (CLOCK_MONOTONIC ns)
  // CPU time the rank and its loader workers have used (ns), sampled now; -1: not sampled
  // at this Check (the last sample stands).
  int64_t cpu_ns = -1;
};

struct StalledRank {
  int rank = 0;
  uint64_t steps = 0;
  int64_t silent_ns = 0;  // since its last step, or since it started
  bool before_first_step = false;
  // Named by the peer-wait rule: the longest a peer has waited for it in a collective, and
  // which peer (-1: named by its silence alone).
  int64_t waited_on_ns = 0;
  int waited_on_by = -1;
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
  // Keeps `cpu_ns` sampled at `now_ns` and drops samples older than one window.
  void NoteCpu(size_t i, int64_t now_ns, int64_t cpu_ns);
  // Whether rank i used less than kIdleCpuFraction of a CPU over the last `window_ns`.
  bool IdleFor(size_t i, int64_t now_ns, int64_t window_ns) const;

  const api::StallPolicy policy_;
  std::vector<std::deque<std::pair<int64_t, int64_t>>> cpu_;  // per rank: (when, cpu ns)
  std::vector<uint64_t> reported_at_;  // per rank: the step count it was reported stalled at
  std::vector<bool> reported_;
  double median_step_s_ = 0;
  std::optional<int64_t> timeout_ns_;
};

// The median of every duration in `ranks`' recent steps, in seconds (0 for none; of an even
// count, the mean of the middle two, as api::Median).
double MedianStepSeconds(const std::vector<RankProgress>& ranks);

// A rank using less than this share of one CPU is idle, not at work (a sleeping or blocked
// Python rank uses ~0; a computing one ~1).
inline constexpr double kIdleCpuFraction = 0.05;

}  // namespace spawnpoint::agent
