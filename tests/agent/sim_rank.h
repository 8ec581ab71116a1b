// A simulated rank for the stall and straggler watches: steps of given durations (and waits
// for peers), and its progress record as the agent would read it. Test-only; not thread-safe.
#pragma once

#include <cstdint>

#include "agent/progress/progress_record.h"
#include "agent/run/stall_watch.h"

namespace spawnpoint::agent {

inline constexpr int64_t kMs = 1'000'000;
inline constexpr int64_t kS = 1'000 * kMs;

struct SimRank {
  int rank = 0;
  int64_t started_ns = 0;
  int64_t now_ns = 0;  // the end of its latest step
  progress::ProgressSnapshot snapshot;
  int64_t cpu_ns = -1;  // what the agent sampled of its CPU time (-1: nothing this Check)

  // One step of `duration_ns`, `wait_ns` of it waiting for peers.
  void Step(int64_t duration_ns, int64_t wait_ns = 0) {
    now_ns += duration_ns;
    snapshot.steps++;
    snapshot.last_step_ns = now_ns;
    snapshot.recent_us.push_back(static_cast<uint32_t>(duration_ns / 1000));
    snapshot.recent_wait_us.push_back(static_cast<uint32_t>(wait_ns / 1000));
    if (snapshot.recent_us.size() > progress::kDurationRing) {
      snapshot.recent_us.erase(snapshot.recent_us.begin());
      snapshot.recent_wait_us.erase(snapshot.recent_wait_us.begin());
    }
  }
  RankProgress Progress() const { return {rank, snapshot, started_ns, cpu_ns}; }
};

}  // namespace spawnpoint::agent
