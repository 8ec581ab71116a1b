// The band of ratios the straggler tests accept for a rank that does a whole number of times
// its peers' work per step (tests/python/stall_scripts/straggler_ddp.py: the same unit of
// work, sleep and compute, counted UNITS times), shared by the agent's, the operator's and
// the simulated tests so that they all decide on one band. Pure; thread-safe.
//
// What is reported is measured (each rank's own time per step: its duration minus its wait
// for peers), but both sides are made of the same counted unit: a loaded machine stretches
// every unit alike, so the ratio stays near the count; what is not doubled (the optimizer
// step, the step's record, a late wake-up) moves it by a few percent. A factor of 1.25 either
// way is a margin load cannot cross, and narrow enough that a ratio mis-scaled by 1.5 or
// more (3x: 6 or 0.67 for a 2x straggler) falls outside it.
#pragma once

namespace spawnpoint::testing {

inline constexpr double kStragglerBandFactor = 1.25;

// Lowest and highest ratio accepted for a rank doing `units` times its peers' work per step.
inline constexpr double StragglerBandLow(double units) { return units / kStragglerBandFactor; }
inline constexpr double StragglerBandHigh(double units) { return units * kStragglerBandFactor; }

}  // namespace spawnpoint::testing
