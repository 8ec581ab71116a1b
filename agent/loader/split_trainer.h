// A trainer in two halves, so that its loader workers (the trainer's own program in worker
// mode, the default worker command) never load libtorch: the executable holds the loader
// and the datasets, no torch, and serves as a worker; as a rank it loads the torch half, a
// shared module beside it, and runs that module's entry point. A worker is then ready ~2 ms
// after exec instead of after libtorch's ~0.4-0.8 s load.
//
//   // train_entry.cc, the executable (datasets.cc linked into both halves):
//   int main(int argc, char** argv) {
//     return spawnpoint::loader::RunSplitTrainer(argc, argv, "libtrain-main.so");
//   }
//   // train.cc, the module (links torch):
//   extern "C" int spawnpoint_trainer_main(int argc, char** argv) {
//     // As in any trainer's main (it returns -1 here): the module's copy of the loader
//     // then knows its program serves as its own workers.
//     if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
//     ... Loader::Create ...
//   }
//
// CMake: spawnpoint_add_split_trainer(train SOURCES train.cc WORKER_SOURCES datasets.cc
// LIBRARIES spawnpoint_loader_torch) builds both (agent/loader/CMakeLists.txt).
//
// The module links its own copy of the loader and registers the datasets in it (a rank with
// 0 workers builds batches itself); the executable's copy only ever serves as a worker.
//
// Thread-safety: call once, from main, before any other thread exists.
#pragma once

#include <string>

namespace spawnpoint::loader {

// The symbol the torch half exports: int spawnpoint_trainer_main(int argc, char** argv).
inline constexpr char kSplitTrainerEntry[] = "spawnpoint_trainer_main";

// A worker (RunWorkerIfRequested) serves and never returns; otherwise loads `module` (a
// path; a relative one is taken from this executable's directory) and returns its entry
// point's result. 127 with a message on stderr when the module or its entry point cannot be
// loaded.
int RunSplitTrainer(int argc, char** argv, const std::string& module);

}  // namespace spawnpoint::loader
