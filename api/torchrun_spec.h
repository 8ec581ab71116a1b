// Internal to api/: a trainer command that starts torchrun, reconciled with the manifest
// while a TrainingJob is decoded, so the agent (plan, run, pods) and the operator (pod
// count, InvalidSpec) see the same job. What each torchrun flag means here is the table in
// docs/kubernetes.md, "Coming from torchrun / PyTorchJob": a value the manifest does not fix is taken
// into the spec, one that agrees is noted, one that contradicts it is an error located at
// the command or args element that holds it, the launcher-only ones are ignored with the
// reason. Pure functions; thread-safe (the FieldReader passed in is the caller's).
#pragma once

#include <nlohmann/json.hpp>

#include "api/field_path.h"
#include "api/field_reader.h"
#include "api/training_job.h"
#include "common/status.h"

namespace spawnpoint::api {

// `spec_json` is the spec as given (at `spec_path`), `spec` its decoded form with the
// trainer, restart policy and rendezvous filled in. When the trainer's command + args start
// torchrun: spec->trainer.command becomes what one rank runs (args empty),
// spec->trainer.torchrun says how, and the flags' values are taken into spec. Errors go
// through `reader` (its error path is the offending element).
Status ApplyTorchrunCommand(const nlohmann::json& spec_json, const FieldPath& spec_path,
                            TrainingJobSpec* spec, FieldReader* reader);

}  // namespace spawnpoint::api
