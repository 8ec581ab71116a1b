// The executable half of a split trainer (split_trainer.h), built by
// spawnpoint_add_split_trainer with SPAWNPOINT_TRAINER_MODULE naming the module beside it.
#include "agent/loader/split_trainer.h"

#ifndef SPAWNPOINT_TRAINER_MODULE
#error "SPAWNPOINT_TRAINER_MODULE must name the torch half (spawnpoint_add_split_trainer)"
#endif

int main(int argc, char** argv) {
  return spawnpoint::loader::RunSplitTrainer(argc, argv, SPAWNPOINT_TRAINER_MODULE);
}
