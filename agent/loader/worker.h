// The entry point of a loader worker. A program that uses the Loader calls
// RunWorkerIfRequested first thing in main (the C++ counterpart of Python's
// `if __name__ == "__main__"` guard under the spawn start method): in a normal process it
// returns -1 at once; in a process the pool owner started as a worker (the environment
// carries SPAWNPOINT_LOADER_LISTEN_FD) it serves batches until the process is stopped and
// never returns to the caller's code.
//
// A worker accepts one client (a rank's Loader) at a time on its inherited listening
// socket, serves it until EOF, then accepts the next: it outlives rank restarts, and keeps
// its dataset while the next client asks for the same one. Single-threaded.
#pragma once

namespace spawnpoint::loader {

int RunWorkerIfRequested(int argc, char** argv);

// Whether RunWorkerIfRequested ran in this process: a standalone Loader re-executes the
// program as its workers and refuses to if the program would not become a worker.
bool WorkerEntryPointCalled();

}  // namespace spawnpoint::loader
