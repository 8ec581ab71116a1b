// The path of the running program, for re-running itself and for finding files installed
// beside it. Normally /proc/self/exe. Inside the agent bundle the process image is the
// bundle's dynamic loader (bin/spawnpoint-agent is a static launcher that executes
// lib/ld-linux-x86-64.so.2 --library-path lib libexec/spawnpoint-agent), so /proc/self/exe
// names ld.so; the launcher therefore puts its own path in SPAWNPOINT_AGENT_EXE. That
// variable is read and removed from the environment before main(), so no child the program
// spawns (trainers, loader workers, node agents) inherits it. Part of the agent only: the
// loader library, which trainers link, reads /proc/self/exe itself.
#pragma once

#include <string>

namespace spawnpoint::agent {

inline constexpr char kSelfExeEnv[] = "SPAWNPOINT_AGENT_EXE";

// SPAWNPOINT_AGENT_EXE as it was at start-up if it held an absolute path, else the target
// of /proc/self/exe; empty if neither is available. Thread-safe.
std::string SelfExecutablePath();

}  // namespace spawnpoint::agent
