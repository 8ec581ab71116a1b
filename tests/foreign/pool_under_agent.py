"""Issue 21's portability acceptance for the loader pool, in one foreign root: the bundle's
`spawnpoint-agent run` serves the DataLoaders of a 2-rank DDP job of the root's own python3
from the agent's Python workers, and
  ddp   the train (DistributedSampler, shuffled, seeded) and validation batches of 2 epochs
        equal stock DataLoader(spawn, persistent)'s in the same rank;
  kill  a worker SIGKILLed mid-epoch costs nothing: every sample once, in order.
The trainer is tests/python/pool_trainers/pool_trainer.py, the same as on Debian 12.
"""

import glob
import json
import os
import sys
import tempfile

import foreign_common as fc

TRAINER = os.path.join(fc.SOURCE, "tests", "python", "pool_trainers", "pool_trainer.py")
POOL_ITER = "_PoolDataLoaderIter"


def run_case(checks, suite, case):
    out = tempfile.mkdtemp(prefix="pool-%s-" % case)
    job = fc.job_yaml("foreign-pool-%s-%s" % (case, suite.replace("_", "-")),
                      [sys.executable, TRAINER, case, out], procs=2, workers=2)
    proc = fc.run_agent(job)
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    if not checks.equal(proc.returncode, 0, "%s: spawnpoint-agent run exit status" % case):
        return {}
    reports = {}
    for path in glob.glob(os.path.join(out, case + "-rank*-attempt0.json")):
        with open(path) as f:
            r = json.load(f)
        reports[r["rank"]] = r
    checks.equal(sorted(reports), [0, 1], "%s: ranks that reported" % case, fc.show(proc))
    for rank, r in sorted(reports.items()):
        served = r["served"] if isinstance(r["served"], list) else [r["served"]]
        checks.equal(served, [POOL_ITER], "%s: rank %d served by the agent's pool" % (case, rank))
    return reports


def main():
    suite = fc.suite()
    checks = fc.Checks("pool_under_agent (%s)" % suite)
    for rank, r in sorted(run_case(checks, suite, "ddp").items()):
        checks.equal(r["equal"], {"train": True, "val": True},
                     "ddp: rank %d batches equal stock DataLoader's" % rank)
    for rank, r in sorted(run_case(checks, suite, "kill").items()):
        checks.check(r["in_order"], "kill: rank %d got every sample once, in order" % rank)
        checks.check(r["replaced"], "kill: rank %d's killed worker %s was replaced by %s" % (
            rank, r["killed"], r["workers"]))
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
