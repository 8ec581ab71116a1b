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
  auto dying = [&](pid_t pid) {
    auto it = last_traceback_.find(pid);
    if (it != last_traceback_.end() && it->second >= *stop_seen_at_ - kRecentTraceback) {
      return true;
    }
    return is_exiting_(pid);
  };
  const bool one_dying = std::any_of(running.begin(), running.end(),
                                     [&](const auto& rank) { return dying(rank.second); });
  return one_dying ? Verdict::kAwaitTheDying : Verdict::kStop;
}

void GangStopCheck::NoteTraceback(pid_t pid) { last_traceback_[pid] = clock_->Now(); }

}  // namespace spawnpoint::agent
