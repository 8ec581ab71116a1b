"""A rank that finished must not crash at exit: gloo_exit_trainer.py as a 2-rank job, RUNS
times, in the frameworks environment (Debian 13's torch 2.6, Python 3.13).

    gloo_exit_under_agent.py [RUNS]

Every run must exit 0 with both ranks done. The crash this guards against is a race (a gloo
worker freeing a tensor while the interpreter finalizes; spawnpoint_rank/_exit.py), so
without the shim's handler this test fails most of the time, not always: 4 runs of 4 failed
here without it (a job at runs 0, 0, 3 and 5 of 12), none of 5 with it.
"""

import sys

sys.path.insert(0, "/opt/spawnpoint-foreign")
import foreign_common as fc  # noqa: E402

TRAINER = "/opt/spawnpoint-tests/gloo_exit_trainer.py"


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    checks = fc.Checks("gloo_exit_under_agent")
    for run in range(runs):
        job = fc.job_yaml("gloo-exit", [sys.executable, TRAINER], procs=2, workers=0)
        proc = fc.run_agent(job)
        done = [line for line in proc.stdout.splitlines() if "SPAWNPOINT-GLOO-EXIT" in line]
        ok = checks.equal(proc.returncode, 0, "run %d: spawnpoint-agent run exit status" % run,
                          fc.show(proc))
        ok = checks.equal(len(done), 2, "run %d: ranks done" % run, fc.show(proc)) and ok
        if not ok:
            break
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
