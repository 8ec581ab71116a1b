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

void StallWatch::NoteCpu(size_t i, int64_t now_ns, int64_t cpu_ns) {
  if (i >= cpu_.size()) cpu_.resize(i + 1);
  auto& samples = cpu_[i];
  if (cpu_ns < 0) return;
  samples.emplace_back(now_ns, cpu_ns);
  // Keep the newest sample at least one window old (what IdleFor compares with) and newer.
  const int64_t window = int64_t{api::StallPolicy::kPeerWaitSeconds} * kNsPerSecond;
  while (samples.size() >= 2 && samples[1].first <= now_ns - window) samples.pop_front();
}

bool StallWatch::IdleFor(size_t i, int64_t now_ns, int64_t window_ns) const {
  if (i >= cpu_.size() || cpu_[i].size() < 2) return false;  // unknown: not idle
  const auto& [then, cpu_then] = cpu_[i].front();
  const auto& [last, cpu_last] = cpu_[i].back();
  if (then > now_ns - window_ns || last <= then) return false;
  return static_cast<double>(cpu_last - cpu_then) <
         kIdleCpuFraction * static_cast<double>(last - then);
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

  // The longest wait for peers in a collective, and whose, for the peer-wait rule.
  const int64_t peer_wait = int64_t{api::StallPolicy::kPeerWaitSeconds} * kNsPerSecond;
  std::vector<std::pair<int64_t, int>> waits;  // (waited ns, rank), per rank in `ranks` order
  for (const RankProgress& r : ranks) {
    const int64_t since = r.snapshot.waiting_since_ns;
    waits.emplace_back(since > 0 ? std::max<int64_t>(0, now_ns - since) : 0, r.rank);
  }

  std::vector<StalledRank> out;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const RankProgress& r = ranks[k];
    if (r.rank < 0) continue;
    const size_t i = static_cast<size_t>(r.rank);
    if (i >= reported_.size()) {
      reported_.resize(i + 1, false);
      reported_at_.resize(i + 1, 0);
    }
    NoteCpu(i, now_ns, r.cpu_ns);
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
    bool named = limit && stalled.silent_ns >= *limit;
    if (!named && !policy_.timeout_seconds && s.waiting_since_ns == 0 &&
        stalled.silent_ns >= peer_wait && IdleFor(i, now_ns, peer_wait)) {
      // A peer waits for it, and it neither steps nor works nor waits itself.
      for (size_t j = 0; j < waits.size(); ++j) {
        if (j != k && waits[j].first >= peer_wait && waits[j].first > stalled.waited_on_ns) {
          stalled.waited_on_ns = waits[j].first;
          stalled.waited_on_by = waits[j].second;
        }
      }
      named = stalled.waited_on_by >= 0;
    }
    if (named) {
      reported_[i] = true;
      reported_at_[i] = s.steps;
      out.push_back(stalled);
    }
  }
  return out;
}

}  // namespace spawnpoint::agent
