#include "agent/run/stall_watch.h"

#include <algorithm>

#include "api/straggler.h"

namespace spawnpoint::agent {
namespace {

constexpr int64_t kNsPerSecond = 1'000'000'000;

}  // namespace

double MedianStepSeconds(const std::vector<RankProgress>& ranks) {
  std::vector<double> all;
  for (const RankProgress& r : ranks) {
    for (uint32_t us : r.snapshot.recent_us) all.push_back(us / 1e6);
  }
  return all.empty() ? 0 : api::Median(std::move(all));  // the straggler judgement's median
}

void StallWatch::MarkReported(int rank, uint64_t steps) {
  if (rank < 0) return;
  const size_t i = static_cast<size_t>(rank);
  if (i >= reported_.size()) {
    reported_.resize(i + 1, false);
    reported_at_.resize(i + 1, 0);
  }
  reported_[i] = true;
  reported_at_[i] = steps;
}

std::vector<StalledRank> StallWatch::Check(const std::vector<RankProgress>& ranks, int64_t now_ns) {
  uint64_t most_steps = 0;
  for (const RankProgress& r : ranks) most_steps = std::max(most_steps, r.snapshot.steps);
  median_step_s_ = agent::MedianStepSeconds(ranks);
  if (policy_.timeout_seconds) {
    timeout_ns_ = int64_t{*policy_.timeout_seconds} * kNsPerSecond;
  } else if (most_steps >= static_cast<uint64_t>(api::StallPolicy::kAutoArmSteps)) {
    timeout_ns_ = std::max<int64_t>(
        int64_t{api::StallPolicy::kAutoFloorSeconds} * kNsPerSecond,
        static_cast<int64_t>(api::StallPolicy::kAutoMedianFactor * median_step_s_ * 1e9));
  } else {
    timeout_ns_.reset();
  }

  std::vector<StalledRank> out;
  for (const RankProgress& r : ranks) {
    if (r.rank < 0) continue;
    const size_t i = static_cast<size_t>(r.rank);
    if (i >= reported_.size()) {
      reported_.resize(i + 1, false);
      reported_at_.resize(i + 1, 0);
    }
    const progress::ProgressSnapshot& s = r.snapshot;
    if (reported_[i] && s.steps != reported_at_[i]) reported_[i] = false;  // it stepped again
    if (reported_[i]) continue;
    StalledRank stalled{r.rank, s.steps, 0, s.steps == 0};
    std::optional<int64_t> limit;
    if (s.steps == 0) {
      stalled.silent_ns = now_ns - r.started_ns;
      if (policy_.startup_timeout_seconds > 0) {
        limit = int64_t{policy_.startup_timeout_seconds} * kNsPerSecond;
      }
    } else {
      stalled.silent_ns = now_ns - s.last_step_ns;
      limit = timeout_ns_;
    }
    if (limit && stalled.silent_ns >= *limit) {
      reported_[i] = true;
      reported_at_[i] = s.steps;
      out.push_back(stalled);
    }
  }
  return out;
}

}  // namespace spawnpoint::agent
