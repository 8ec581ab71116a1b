// spawnpoint::Step(): a trainer says "one training step done". Call it once per step, from
// any thread, in a rank started by spawnpoint-agent; the agent learns the rank's step count
// and step times from it (hang and straggler detection). Outside the agent (no
// SPAWNPOINT_PROGRESS_FILE) it does nothing and costs an atomic load.
//
// Only needed by trainers that neither take batches from spawnpoint's loader (its Next()
// counts steps) nor are Python trainers with an optimizer (the start-up shim counts
// optimizer steps). Once Step() was called, those automatic counts stop, so a trainer is
// never counted twice. Python: `import spawnpoint; spawnpoint.step()`.
//
// spawnpoint::PeerWait: a trainer that runs its own collectives (rather than DDP, which the
// Python shim times by itself) marks the time it blocks on its peers, so the agent can tell
// a straggler from the ranks waiting for it: `{ spawnpoint::PeerWait w; work->wait(); }`.
// The wait counts towards the step in flight. Scoped; not copyable; any thread.
#pragma once

#include <cstdint>

namespace spawnpoint {

void Step();

class PeerWait {
 public:
  PeerWait();
  ~PeerWait();
  PeerWait(const PeerWait&) = delete;
  PeerWait& operator=(const PeerWait&) = delete;

 private:
  int64_t start_ns_;
};

}  // namespace spawnpoint
