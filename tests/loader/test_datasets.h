// Datasets for the loader tests, registered by name in every program that links
// test_datasets.cc (the test binary and the test trainer, which also serve as workers).
// Arguments are "key=value,key=value". Every sample carries its own index, so a test can
// check which samples arrived, plus where it was built:
//   index    {index: i64, value: f32[dim] = index, worker: i32, incarnation: i32, pid: i64}
//            size=N dim=D work=K (K rounds of arithmetic per sample) print=1 (a stdout line
//            on creation) sleep_ms=S (per sample) slow_worker=W (only worker W sleeps)
//   hang     as index; the first process to reach sample `at` creates `marker` and sleeps
//            forever (later attempts find the marker and go on)
//   throw    as index; sample `at` throws std::runtime_error (mode=status: returns an error)
//   crash    as index; sample `at` writes a stderr line and raises signal `signal` (9, 7 = SIGBUS)
//            while incarnation < `until_incarnation` (default: always), and, with
//            `marker`, only in the first process that creates the marker
//   augment  as index, plus rand: i64 (a draw from ctx.rng) and seed: i64 (ctx.seed)
//   varsize  as index, but samples >= `grow_at` have `big_dim` values
#pragma once

#include <map>
#include <string>

namespace spawnpoint::loader::testing {

std::map<std::string, std::string> ParseArgs(const std::string& arg);

}  // namespace spawnpoint::loader::testing
