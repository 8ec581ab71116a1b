#include "agent/run/gang_stop_check.h"

#include <algorithm>

namespace spawnpoint::agent {

GangStopCheck::GangStopCheck(Clock* clock, std::function<bool()> stop_seen,
                             std::function<bool(pid_t)> is_exiting,
                             std::chrono::milliseconds dying_wait)
    : clock_(clock),
      stop_seen_(std::move(stop_seen)),
      is_exiting_(std::move(is_exiting)),
      dying_wait_(dying_wait) {}

GangStopCheck::Verdict GangStopCheck::Check(const std::vector<std::pair<int, pid_t>>& running) {
  if (!stop_seen_()) return Verdict::kRun;
  const Clock::TimePoint now = clock_->Now();
  if (!stop_seen_at_) stop_seen_at_ = now;
  if (now - *stop_seen_at_ >= dying_wait_) return Verdict::kStop;
  const bool one_dying = std::any_of(running.begin(), running.end(),
                                     [&](const auto& rank) { return is_exiting_(rank.second); });
  return one_dying ? Verdict::kAwaitTheDying : Verdict::kStop;
}

}  // namespace spawnpoint::agent
