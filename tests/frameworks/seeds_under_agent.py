"""Issue 24: the seeds' plain-PyTorch cases on torch 2.x, in the frameworks environment.

    seeds_under_agent.py CASE

Runs tests/python/pool_trainers/pool_trainer.py CASE (bound at /opt/spawnpoint-pool-trainers)
as a 2-rank job with 2 loader workers per rank under the agent, with the frameworks
environment's Debian 13 torch 2.6 and Python 3.13, and checks the ranks' reports as
tests/python/test_pool_agent.py does on Debian 12's torch 1.13:
  knobs         DDP with persistent_workers, prefetch_factor=3, a worker_init_fn of the
                script's, a seeded generator and set_epoch: batches equal stock DataLoader's
  start_method  mp.set_start_method('spawn', force=True) before anything else: served
  mp_pool       an mp.get_context('spawn').Pool started after tensors exist: served
"""

import glob
import json
import os
import sys

sys.path.insert(0, "/opt/spawnpoint-foreign")
import foreign_common as fc  # noqa: E402

TRAINER = "/opt/spawnpoint-pool-trainers/pool_trainer.py"
POOL_ITER = "_PoolDataLoaderIter"


def main():
    case = sys.argv[1]
    checks = fc.Checks("seeds_under_agent %s" % case)
    out_dir = "/tmp/seeds-%s" % case
    os.makedirs(out_dir)
    job = fc.job_yaml("seeds-" + case.replace("_", "-"), [sys.executable, TRAINER, case, out_dir],
                      procs=2, workers=2)
    proc = fc.run_agent(job)
    sys.stdout.write(proc.stdout + proc.stderr)
    if not checks.equal(proc.returncode, 0, "spawnpoint-agent run exit status"):
        return checks.finish()
    reports = {}
    for path in glob.glob(os.path.join(out_dir, case + "-rank*-attempt*.json")):
        with open(path) as f:
            r = json.load(f)
        reports[r["rank"]] = r
    checks.equal(sorted(reports), [0, 1], "ranks that reported")
    for rank, r in sorted(reports.items()):
        served = r["served"]
        checks.equal(served, POOL_ITER, "rank %d: the iterator that served the DataLoader" % rank)
        if case == "knobs":
            checks.equal(r["stock"], "_MultiProcessingDataLoaderIter", "rank %d: stock's" % rank)
            checks.check(r["equal"], "rank %d: batches equal stock DataLoader's (3 epochs)" % rank)
            checks.equal(r["batches"], 15, "rank %d: batches" % rank)
        elif case == "start_method":
            checks.equal(r["indices"], list(range(8)), "rank %d: samples in order" % rank)
        elif case == "mp_pool":
            checks.equal(r["squares"], [0, 1, 4, 9, 16, 25], "rank %d: the Pool's results" % rank)
            checks.equal(r["indices"], list(range(8)), "rank %d: samples in order" % rank)
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
