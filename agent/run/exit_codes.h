// The exit codes of spawnpoint-agent: what a script, a CI job or the kubelet learns from the
// agent's own exit. A rank's exit code is never passed through: a rank that exits 2 (an
// argparse error) must not read as the agent's "bad input". The failing rank's own code,
// signal and cause are in the termination log (--termination-log, JSON) and on the agent's
// last line. docs/running.md ("Exit codes") and `spawnpoint-agent --help` show this table.
// Constants only; thread-safe.
#pragma once

namespace spawnpoint::agent {

// 0: the job succeeded (every rank exited 0, after any restarts).
inline constexpr int kExitSucceeded = 0;
// 1: the job failed: a rank failed and is not restarted (its code is not retryable, the
// restart budget is spent, or the operator restarts a gang spanning nodes); or this
// machine cannot run the job (no GPU for gpusPerNode > 0, an unhealthy GPU, /dev/shm too
// small, node 0's rendezvous port in use: PortInUse), nothing started.
inline constexpr int kExitJobFailed = 1;
// 2: bad input: flags, the manifest (a missing or unreadable file included), the trainer
// command or its Python script; one line names it; nothing started.
inline constexpr int kExitBadInput = 2;
// 128 + N: the agent itself was stopped by signal N (SIGTERM: 143, SIGINT: 130); its ranks
// were stopped first.
inline constexpr int ExitForSignal(int signal) { return 128 + signal; }

}  // namespace spawnpoint::agent
