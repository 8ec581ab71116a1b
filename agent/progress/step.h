// spawnpoint::Step(): a trainer says "one training step done". Call it once per step, from
// any thread, in a rank started by spawnpoint-agent; the agent learns the rank's step count
// and step times from it (hang and straggler detection). Outside the agent (no
// SPAWNPOINT_PROGRESS_FILE) it does nothing and costs an atomic load.
//
// Only needed by trainers that neither take batches from spawnpoint's loader (its Next()
// counts steps) nor are Python trainers with an optimizer (the start-up shim counts
// optimizer steps). Once Step() was called, those automatic counts stop, so a trainer is
// never counted twice. Python: `import spawnpoint; spawnpoint.step()`.
#pragma once

namespace spawnpoint {

void Step();

}  // namespace spawnpoint
