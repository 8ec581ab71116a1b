// How a straggler is judged from the ranks' own work per step (issue 13), shared by the agent
// (its node's ranks, from their progress records) and the operator (the whole job's ranks,
// from the agents' /status documents) so both say the same thing.
//
// A rank's own work for a step is the step's duration minus the time it waited for its
// peers in collectives (agent/progress/progress_record.h): in synchronous training every
// rank's steps take as long as the slowest one's, and only this difference tells them
// apart. Each rank's figure is the median over its last kStragglerWindowSteps steps. The
// slowest rank is compared with the median of the other ranks' figures; it is a straggler
// at spec.stallPolicy.stragglerRatio or more (and at least kStragglerMinExcessSeconds more
// work per step, so microsecond steps do not raise noise), and stays one until its ratio
// falls below halfway between 1 and that ratio. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

namespace spawnpoint::api {

inline constexpr int kStragglerWindowSteps = 20;
inline constexpr double kStragglerMinExcessSeconds = 0.001;

struct StragglerJudgement {
  size_t index = 0;               // of the slowest entry in the figures judged
  double ratio = 0;               // its own work over the others' median
  double busy_seconds = 0;        // its median own work per step
  double peers_busy_seconds = 0;  // the median of the other ranks' figures
};

// The slowest of `busy_seconds` (one median per rank) against the others; nullopt for fewer
// than two ranks or when the others did no measurable work.
std::optional<StragglerJudgement> JudgeSlowest(const std::vector<double>& busy_seconds);

// Whether `j` names a straggler at `ratio` (stallPolicy.stragglerRatio); `named`: it was
// already named, and stays so down to the halfway ratio.
bool IsStraggler(const StragglerJudgement& j, double ratio, bool named);

// The median of `values` (0 for none); the mean of the middle two for an even count.
double Median(std::vector<double> values);

}  // namespace spawnpoint::api
