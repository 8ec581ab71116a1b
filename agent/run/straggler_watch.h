// StragglerWatch names a rank slower than its peers on this node (issue 13), from their
// progress records: each rank's own work per step (the step's duration minus its wait for
// peers), as a median over its last api::kStragglerWindowSteps steps, judged as
// api/straggler.h says. A rank is named once its ratio has held at the policy's
// stragglerRatio for a whole window of its steps (a pause of a few steps does not name it),
// and cleared when it falls below the halfway ratio or a new attempt starts. Pure: the caller
// reads the records; tested on made-up records. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "agent/run/stall_watch.h"
#include "api/straggler.h"

namespace spawnpoint::agent {

// One rank's medians over its last window of steps; nullopt fields until it has a window.
struct RankBusy {
  int rank = 0;
  std::optional<double> busy_seconds;  // own work per step
  std::optional<double> wait_seconds;  // waiting for peers per step
};

// Every rank's medians, in the order of `ranks`.
std::vector<RankBusy> BusyMedians(const std::vector<RankProgress>& ranks);

struct Straggler {
  int rank = 0;
  api::StragglerJudgement judgement;
  uint64_t steps = 0;  // the rank's step count when it was named
};

class StragglerWatch {
 public:
  explicit StragglerWatch(double ratio) : ratio_(ratio) {}

  struct Verdict {
    std::optional<Straggler> straggler;  // the rank named now, if any
    bool changed = false;                // named, cleared or another rank since the last Check
  };
  Verdict Check(const std::vector<RankProgress>& ranks);

  // The slowest rank's ratio at the last Check (0: not judged: fewer than two ranks with a
  // full window).
  double Ratio() const { return ratio_seen_; }

 private:
  const double ratio_;
  std::optional<Straggler> named_;
  // The candidate whose ratio holds, and its step count when it first did.
  std::optional<std::pair<int, uint64_t>> candidate_;
  double ratio_seen_ = 0;
};

}  // namespace spawnpoint::agent
