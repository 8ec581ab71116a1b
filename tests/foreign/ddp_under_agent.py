"""Issue 21's portability acceptance, in one foreign root: the bundle's
`spawnpoint-agent run` starts a 2-rank DDP job (gloo, CPU) of the root's own python3, whose
DataLoader gets 2 spawned workers from the job's pool through the bundle's shim (kept across
epochs by the pool; persistent_workers stays the code's, as under torchrun), for 2 epochs; it exits 0, and each rank says it ran on the root's Python, torch and glibc.
"""

import os
import sys

import foreign_common as fc

EPOCHS = 2
WORKERS = 2


def main():
    suite = fc.suite()
    want = fc.EXPECTED[suite]
    checks = fc.Checks("ddp_under_agent (%s)" % suite)
    trainer = os.path.join(fc.TESTS, "ddp_trainer.py")
    job = fc.job_yaml("foreign-ddp-" + suite, [sys.executable, trainer, str(EPOCHS)],
                      procs=2, workers=WORKERS)
    proc = fc.run_agent(job, env={"SPAWNPOINT_SHIM_DEBUG": "1"})
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    if not checks.equal(proc.returncode, 0, "spawnpoint-agent run exit status"):
        return checks.finish()
    reports = fc.rank_reports(proc.stdout, "SPAWNPOINT-FOREIGN")
    if not checks.equal(sorted(reports), [0, 1], "ranks that reported", fc.show(proc)):
        return checks.finish()

    for rank, r in sorted(reports.items()):
        print("rank %d ran Python %s (%s), torch %s, %s, Debian %s" % (
            rank, r["python"], r["executable"], r["torch"], r["glibc"], r["debian"]))
        checks.equal(fc.major_minor(r["python"]), want["python"], "rank %d Python" % rank)
        checks.equal(fc.major_minor(r["torch"]), want["torch"], "rank %d torch" % rank)
        checks.equal(fc.major_minor(r["glibc"].replace("glibc ", "")), want["glibc"],
                     "rank %d glibc" % rank)
        checks.equal((r["debian"] or "").split(".")[0], want["debian"],
                     "rank %d /etc/debian_version" % rank)
        checks.equal(r["world_size"], 2, "rank %d world size" % rank)
        checks.check(r["shim_active"] and r["shim_file"] ==
                     "/opt/spawnpoint/share/spawnpoint/python/sitecustomize.py",
                     "rank %d runs the bundle's shim (%s)" % (rank, r["shim_file"]))
        checks.equal((r["num_workers"], r["context"], r["persistent_workers"]),
                     (WORKERS, "spawn", False),
                     "rank %d DataLoader (num_workers, context, persistent_workers)" % rank)
        epochs = r["epochs"]
        checks.equal(len(epochs), EPOCHS, "rank %d epochs" % rank)
        checks.equal([e["samples"] for e in epochs], [32] * EPOCHS,
                     "rank %d samples per epoch (64 sharded over 2 ranks)" % rank)
        pids = [e["worker_pids"] for e in epochs]
        checks.check(all(len(p) == WORKERS and r["pid"] not in p for p in pids),
                     "rank %d batches came from %d worker processes, not the rank: %s"
                     % (rank, WORKERS, pids))
        checks.check(all(p == pids[0] for p in pids),
                     "rank %d workers persisted across epochs: %s" % (rank, pids))
        checks.check(r["replicas_equal"], "rank %d: DDP replicas equal after training" % rank)
    checks.equal(reports[0]["params"], reports[1]["params"], "both ranks' final parameters")
    out = proc.stdout + proc.stderr
    checks.check("set num_workers=0->%d (job), multiprocessing_context='spawn', "
                 "prefetch_factor=2 (job)" % WORKERS in out,
                 "the shim says it gave the DataLoader the job's workers")
    checks.check("all ranks succeeded" in out, "the agent reports that all ranks succeeded")
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
