// The datasets of `make bench-loader`, the same per-sample work as bench/loader_reference.py:
//   bench-transfer  "size=N,floats=F": sample i is a float32 array of F values equal to i
//                   (torch.full((F,), i)); almost no compute, the cost is moving batches.
//   bench-compute   "size=N,work_us=W": W microseconds of busy CPU spun on the clock (as the
//                   reference spins on time.perf_counter), then 256 floats equal to i.
// Both have one field, "x"; the default collate stacks it to [batch, F] / [batch, 256], the
// shape DataLoader's default_collate gives. Compiled into every executable that serves them
// (the bench and its torch-free worker), so the static registration is never dropped.
#pragma once

namespace spawnpoint::bench {

inline constexpr char kTransferDataset[] = "bench-transfer";
inline constexpr char kComputeDataset[] = "bench-compute";

}  // namespace spawnpoint::bench
