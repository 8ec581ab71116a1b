// spawnpoint-loader-bench-worker: a loader worker without libtorch that serves the bench's
// datasets, for LoaderOptions::worker_command (the job's loader.workerCommand). It starts in
// about a millisecond, where a worker that is the libtorch-linked trainer itself first
// spends ~0.3 s loading libtorch. Run by hand it only explains itself.
#include <cstdio>

#include "agent/loader/worker.h"

int main(int argc, char** argv) {
  if (int rc = spawnpoint::loader::RunWorkerIfRequested(argc, argv); rc >= 0) return rc;
  std::fprintf(stderr,
               "%s: a loader worker for spawnpoint-loader-bench; it is started by the loader "
               "(LoaderOptions::worker_command), not by hand\n",
               argc > 0 ? argv[0] : "spawnpoint-loader-bench-worker");
  return 2;
}
