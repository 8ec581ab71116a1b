// runPolicy.suspend: true stops the job without finishing it (its pods are deleted, phase
// Suspended, startTime cleared so the deadline restarts on resume); false again resumes it
// and the current attempt's gang is recreated. Pure; thread-safe.
#pragma once

#include "api/training_job.h"

namespace spawnpoint::op {

enum class SuspendTransition {
  kNone,     // nothing to change
  kSuspend,  // suspend now (or stay suspended): delete pods
  kResume,   // was suspended, now resumed
};

// `was_suspended`: the Suspended condition is True in the status.
SuspendTransition DecideSuspend(const api::RunPolicy& policy, bool was_suspended);

}  // namespace spawnpoint::op
