"""Issue 24: Lightning's DDP strategies under the agent, in the frameworks environment.

    lightning_under_agent.py STRATEGY        a 2-rank job (gloo, CPU) of lightning_trainer.py
    lightning_under_agent.py --devices N     strategy ddp, Trainer(devices=N) against 2 ranks
    lightning_under_agent.py --unhooked S    the control: S with the shim off (SPAWNPOINT_SHIM=0)
    lightning_under_agent.py --pool S        lightning_trainer.py --batches S, workersPerRank 2,
                                             on the agent's pool and with pythonPool: false
    lightning_under_agent.py --library-strategy
                                             a 2-rank job of lightning_trainer.py
                                             --library-strategy (pytorch_lightning)

For STRATEGY (ddp, ddp_spawn, ddp_fork, ddp_notebook, auto) the job exits 0 and: exactly the
agent's 2 ranks ran training steps (no second set of ranks: no other process stepped), each
rank's parent is the agent (the same process for both, neither a rank), no process was forked
(no 'SPAWNPOINT-FORKED' line: os.register_at_fork in the trainer) and no rank has a child
left, Lightning used DDPStrategy with start method 'popen', the TorchElasticEnvironment and
no launching, both ranks ended with the same parameters, each rank's 8 optimizer steps were
counted with their wait for DDP's allreduce (issue 13), and the shim's mapping line was
printed exactly once. --library-strategy is checked the same way, on the standalone
pytorch_lightning with a library's DDPStrategy subclass that makes its own
_MultiProcessingLauncher subclass in _configure_launcher and refuses "popen" (RF-DETR's
ddp_notebook is such a class), given as an object with start method "spawn": Lightning's
strategy is that class with start method 'popen' and Lightning's _SubprocessScriptLauncher
(DDPStrategy's own _configure_launcher made it), and the line says so. With --devices N (N !=
2) the job fails at Trainer creation with the shim's error naming the values and the trainer's
line. The control (--unhooked ddp_fork) shows that these checks see what Lightning does without
the shim: each rank forks its own 2 DDP processes (4 'SPAWNPOINT-FORKED' lines), whatever
becomes of them afterwards.

With --pool S the same reproducible script (lightning_trainer.py --batches: seeded, shuffled,
augmented with torch, numpy and random draws in the workers, dropout in the rank, a persistent
train loader and a validation loader whose workers start anew at each iter(), 2 epochs) runs
as two 2-rank jobs: on the agent's pool (which serves the DataLoaders Lightning re-makes with
a DistributedSampler) and with `loader.pythonPool: false` (the same DataLoaders on torch's own
spawned workers). Every rank must see, step by step (the sanity check's 2 validation batches,
then per epoch 6 train and 3 validation batches), the same batches on both: stage, epoch,
batch index, sample indices, a SHA-256 of every field's bytes and the step's loss; and end
with the same parameters. The checks that make this mean something: each side's iterators
are the ones asked for (the pool's on one side, torch's with 2 workers on the other; one
train iterator resumed each epoch, a new validation iterator each time), the shards cover
the train set each epoch in a new order, and no two batches are alike. On the pool's side
also: no fork, no child of a rank, its 20 batches / 80 samples in the agent's status, its 2
workers never restarted, nothing fell back to torch's workers.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, "/opt/spawnpoint-foreign")
import foreign_common as fc  # noqa: E402

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_trainer.py")
# A job of --pool takes 15-50 s on an idle 2-core machine, minutes on a loaded one (the
# stock job spawns 16 workers that import torch and Lightning); CMakeLists.txt gives the
# test time for two.
JOB_TIMEOUT_S = 660


def lines(out, tag):
    found = []
    for line in out.splitlines():
        at = line.find(tag + " ")
        if at >= 0:
            found.append(json.loads(line[at + len(tag) + 1:]))
    return found


LIBRARY = "--library-strategy"
# lightning_trainer.py --library-strategy's object: its class, and what the line says of it.
LIBRARY_CLASS = "_LibrarySpawnDDPStrategy"
# A job takes 15-60 s; without the mapping a library's spawned processes may hang.
LIBRARY_TIMEOUT_S = 300


def run_strategy(strategy):
    checks = fc.Checks("lightning_under_agent %s" % strategy)
    library = strategy == LIBRARY
    label = "library-strategy" if library else strategy.replace("_", "-")
    job = fc.job_yaml("lightning-" + label, [sys.executable, TRAINER, strategy], procs=2,
                      workers=0)
    status = "/tmp/lightning-%s-status.json" % label
    try:
        proc = fc.run_agent(job, args=["--status-file", status],
                            timeout=LIBRARY_TIMEOUT_S if library else 600)
    except subprocess.TimeoutExpired as err:  # a failure, with what the job said until then
        sys.stdout.write("".join(part if isinstance(part, str) else (part or b"").decode(
            errors="replace") for part in (err.stdout, err.stderr)))
        checks.check(False, "the job ended within %d s" % err.timeout)
        return checks.finish()
    out = proc.stdout + proc.stderr
    sys.stdout.write(out)
    if not checks.equal(proc.returncode, 0, "spawnpoint-agent run exit status"):
        return checks.finish()
    steps = lines(proc.stdout, "SPAWNPOINT-STEP")
    finals = lines(proc.stdout, "SPAWNPOINT-LIGHTNING")
    forked = lines(proc.stdout, "SPAWNPOINT-FORKED")
    checks.equal(sorted(s["global_rank"] for s in steps), [0, 1],
                 "Lightning ranks of the processes that ran training steps (no second set)")
    checks.check(all(s["rank_env"] == str(s["global_rank"]) for s in steps),
                 "each stepping process is the agent's rank of its global rank: %s" % steps)
    checks.equal(sorted(f["rank_env"] for f in finals), ["0", "1"], "ranks that finished fit()")
    step_pids = sorted(s["pid"] for s in steps)
    checks.equal(sorted(f["pid"] for f in finals), step_pids,
                 "the processes that finished fit() are the ones that stepped")
    parents = set(f["ppid"] for f in finals) | set(s["ppid"] for s in steps)
    checks.check(len(parents) == 1 and not parents & set(step_pids),
                 "every rank's parent is the agent (one process, not a rank): %s" % sorted(parents))
    checks.equal(forked, [], "processes created by fork()")
    checks.equal([f["children"] for f in finals], [[]] * len(finals), "ranks' child processes")
    for f in sorted(finals, key=lambda f: f["rank_env"]):
        checks.equal((f["strategy"], f["start_method"], f["cluster_environment"], f["world_size"]),
                     (LIBRARY_CLASS if library else "DDPStrategy", "popen",
                      "TorchElasticEnvironment", 2),
                     "rank %s: strategy, start method, cluster environment, world size"
                     % f["rank_env"])
        if library:
            checks.equal(f["launcher"], "_SubprocessScriptLauncher",
                         "rank %s: the launcher (DDPStrategy's own _configure_launcher made "
                         "it, not the library's)" % f["rank_env"])
    if len(finals) == 2:
        checks.equal(finals[0]["params"], finals[1]["params"], "both ranks' final parameters")
        print("lightning %s, torch %s" % (finals[0]["lightning"], finals[0]["torch"]))
    # Issue 13: DDP's allreduce wait timed with no change to the trainer, for each of the 8
    # optimizer steps (2 epochs of 4 batches a rank) the agent counted.
    with open(status) as f:
        progress = json.load(f)["progress"]
    checks.equal(sorted((p["rank"], p["steps"]) for p in progress), [(0, 8), (1, 8)],
                 "optimizer steps each rank's progress record counted")
    checks.equal([f["ddp_waits"] for f in finals], [8] * len(finals),
                 "backward passes whose wait for DDP's allreduce was added to the step")
    mapping = [l for l in out.splitlines() if "spawnpoint-shim: Lightning strategy" in l]
    checks.equal(len(mapping), 1, "mapping lines printed", "\n".join(mapping))
    want = {"ddp": "Lightning strategy ddp: the agent's 2 ranks run it; Lightning launches nothing",
            "auto": "Lightning strategy auto (ddp): the agent's 2 ranks run it; Lightning "
                    "launches nothing",
            "ddp_spawn": "Lightning strategy ddp_spawn: the agent's 2 ranks run it (as ddp); "
                         "nothing is spawned",
            "ddp_fork": "Lightning strategy ddp_fork: the agent's 2 ranks run it (as ddp); "
                        "nothing is forked",
            "ddp_notebook": "Lightning strategy ddp_notebook: the agent's 2 ranks run it (as "
                            "ddp); nothing is forked",
            LIBRARY: "Lightning strategy %s(start_method='spawn'): the agent's 2 ranks run it "
                     "as DDPStrategy(start_method='popen') with DDPStrategy's own launcher (its "
                     "_configure_launcher is not used); nothing is spawned" % LIBRARY_CLASS,
            }[strategy]
    checks.check(len(mapping) == 1 and mapping[0].endswith(want),
                 "the mapping line says: %s" % want)
    checks.check("all ranks succeeded" in out, "the agent reports that all ranks succeeded")
    return checks.finish()


def run_devices(devices):
    checks = fc.Checks("lightning_under_agent --devices %d" % devices)
    job = fc.job_yaml("lightning-devices", [sys.executable, TRAINER, "ddp", str(devices)],
                      procs=2, workers=0)
    proc = fc.run_agent(job)
    out = proc.stdout + proc.stderr
    sys.stdout.write(out)
    checks.check(proc.returncode != 0, "the job fails (exit %d)" % proc.returncode)
    want = ("spawnpoint: Trainer(devices=%d, num_nodes=1) contradicts the job, which runs 2 "
            "ranks per node on 1 node(s)" % devices)
    checks.check(want in out, "the error names the values: %s" % want)
    checks.check("(at %s:" % TRAINER in out, "the error names the trainer's line (%s:N)" % TRAINER)
    checks.equal(lines(proc.stdout, "SPAWNPOINT-STEP"), [], "training steps run")
    return checks.finish()


def run_batches(strategy, name, pool):
    """lightning_trainer.py --batches STRATEGY as a 2-rank job with workersPerRank 2, on the
    agent's pool or (pool false) on stock DataLoader's workers: (the agent's exit status and
    output, {rank: its SPAWNPOINT-LIGHTNING document}, the agent's status file)."""
    job = fc.job_yaml(name, [sys.executable, TRAINER, "--batches", strategy], procs=2,
                      workers=2, python_pool=pool)
    status = "/tmp/%s-status.json" % name
    started = time.monotonic()
    try:
        proc = fc.run_agent(job, args=["--status-file", status], timeout=JOB_TIMEOUT_S)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:  # a failure, with what the job said until then
        rc, out = "timed out after %d s" % JOB_TIMEOUT_S, "".join(
            part if isinstance(part, str) else (part or b"").decode(errors="replace")
            for part in (err.stdout, err.stderr))
    # The output is printed, abridged, after the checks when one fails (run_pool): CI shows
    # the start of a failed test's output, which must be the checks, not 20 KB documents.
    print("%s: the job took %.1f s, exit %s" % (name, time.monotonic() - started, rc))
    finals = {int(f["rank_env"]): f for f in lines(out, "SPAWNPOINT-LIGHTNING")}
    return rc, out, finals, status


def abridged(name, out, width=300):
    """A job's output for a failure's reader: each line cut to `width` characters."""
    print("--- %s's output (lines cut to %d characters) ---" % (name, width))
    for line in out.splitlines():
        print(line if len(line) <= width else "%s ... (%d characters)" % (line[:width], len(line)))


def batch_differences(got, want):
    """Where the pool's batches differ from stock's (for the failure message): each differing
    record of either side, in order, up to 8."""
    out = []
    if len(got) != len(want):
        out.append("%d batches, stock %d" % (len(got), len(want)))
    for n, (a, b) in enumerate(zip(got, want)):
        if a != b:
            out.append("#%d pool  %s\n    stock %s" % (n, a, b))
    return "\n".join(out[:8])


def run_pool(strategy):
    """--pool S: the same script on the pool and on stock DataLoader, every batch equal."""
    rc, out, pool, status = run_batches(strategy, "lightning-pool", True)
    stock_rc, stock_out, stock, _ = run_batches(strategy, "lightning-stock", False)
    checks = fc.Checks("lightning_under_agent --pool %s" % strategy)
    result = compare_pool(checks, rc, out, pool, status, stock_rc, stock)
    if result != 0:
        abridged("lightning-pool", out)
        abridged("lightning-stock", stock_out)
    return result


def compare_pool(checks, rc, out, pool, status, stock_rc, stock):
    """run_pool's checks: 0 when all passed."""
    checks.equal(rc, 0, "the job on the agent's pool: spawnpoint-agent run exit status")
    checks.equal(stock_rc, 0, "the job with pythonPool: false: spawnpoint-agent run exit status")
    if not checks.equal((sorted(pool), sorted(stock)), ([0, 1], [0, 1]),
                        "ranks that finished fit() (pool, stock)"):
        return checks.finish()
    print("lightning %s, torch %s" % (pool[0]["lightning"], pool[0]["torch"]))
    checks.equal(lines(out, "SPAWNPOINT-FORKED"), [], "processes created by fork()")
    checks.equal([pool[r]["children"] for r in (0, 1)], [[], []],
                 "ranks' child processes (the workers are the agent's)")
    # Which iterator each iter() got: the sanity check's and each epoch's validation, each a
    # new iterator (persistent_workers=False); the train loader's one persistent iterator,
    # resumed each epoch; 2 workers (the job's) for both.
    for side, finals, served in (("pool", pool, "_PoolDataLoaderIter"),
                                 ("stock", stock, "_MultiProcessingDataLoaderIter")):
        for rank in (0, 1):
            its = finals[rank]["iterators"]
            checks.equal([(i[0], i[1], i[3], i[4]) for i in its],
                         [("val", served, 2, False)] + [("train", served, 2, True),
                                                        ("val", served, 2, False)] * 2,
                         "%s, rank %d: each iter()'s loader, iterator, workers, persistence"
                         % (side, rank))
            train = [i[2] for i in its if i[0] == "train"]
            val = [i[2] for i in its if i[0] == "val"]
            checks.check(len(set(train)) == 1 and len(set(val)) == len(val),
                         "%s, rank %d: one train iterator for every epoch, a new validation "
                         "iterator each time: %s" % (side, rank, its))
    # What every step saw, in order: the sanity check's 2 validation batches, then per epoch
    # 6 train batches (24 samples a rank) and 3 validation batches (12 samples a rank).
    layout = ([("sanity", 0, b) for b in range(2)]
              + [(stage, e, b) for e in range(2)
                 for stage, n in (("train", 6), ("val", 3)) for b in range(n)])
    for rank in (0, 1):
        got, want = pool[rank]["batches"], stock[rank]["batches"]
        checks.equal([tuple(b[:3]) for b in want], layout,
                     "stock, rank %d: (stage, epoch, batch) of every step" % rank)
        checks.check(got == want, "rank %d: every batch the pool served (stage, epoch, batch, "
                     "sample indices, SHA-256 of its fields, the step's loss) equals stock "
                     "DataLoader's (%d batches)" % (rank, len(want)),
                     batch_differences(got, want))
        checks.equal(pool[rank]["params"], stock[rank]["params"],
                     "rank %d: final parameters, pool against stock" % rank)
    # The comparison means something: the ranks saw disjoint shards, each sample of the train
    # set once an epoch, in an order that changes each epoch; no two batches (augmented
    # differently each epoch) alike.
    train = {r: [b for b in stock[r]["batches"] if b[0] == "train"] for r in (0, 1)}
    for e in range(2):
        shards = [sorted(i for b in train[r] if b[1] == e for i in b[3]) for r in (0, 1)]
        checks.equal(sorted(shards[0] + shards[1]), list(range(48)),
                     "epoch %d: the train samples both ranks saw" % e)
    orders = [[i for b in train[0] if b[1] == e for i in b[3]] for e in range(2)]
    checks.check(len(set(map(tuple, orders))) == 2, "rank 0: a new order each epoch: %s" % orders)
    digests = [b[4] for r in (0, 1) for b in stock[r]["batches"]]
    checks.equal(len(set(digests)), len(digests), "distinct batches (augmentations differ)")
    checks.equal(pool[0]["params"], pool[1]["params"], "both ranks' final parameters (pool)")
    with open(status) as f:
        loaders = json.load(f)["loader"]
    checks.equal(sorted(l["rank"] for l in loaders), [0, 1], "ranks with a loader pool")
    for l in sorted(loaders, key=lambda l: l["rank"]):
        checks.equal((l["stats"]["batches"], l["stats"]["samples"]), (20, 80),
                     "rank %d: batches and samples the pool served" % l["rank"])
        checks.equal([(w["incarnation"], w["exits"]) for w in l["pool"]["workers"]],
                     [(0, 0), (0, 0)], "rank %d: its 2 workers, never restarted" % l["rank"])
    checks.check(not [l for l in out.splitlines() if "falls back" in l or "fall back" in l
                      or "runs on torch's own workers" in l],
                 "no loader fell back to torch's workers")
    return checks.finish()


def run_unhooked(strategy):
    checks = fc.Checks("lightning_under_agent --unhooked %s" % strategy)
    job = fc.job_yaml("lightning-unhooked",
                      ["/usr/bin/env", "SPAWNPOINT_SHIM=0", "USE_LIBUV=0", sys.executable,
                       TRAINER, strategy], procs=2, workers=0)
    try:
        proc = fc.run_agent(job, timeout=120)
        stdout, out = proc.stdout, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:  # Lightning's own children may hang: fine here
        stdout = err.stdout if isinstance(err.stdout, str) else (err.stdout or b"").decode()
        out = stdout
    sys.stdout.write(out)
    forked = lines(stdout, "SPAWNPOINT-FORKED")
    checks.equal(sorted(f["rank_env"] for f in forked), ["0", "0", "1", "1"],
                 "without the shim: processes forked by each agent rank (Lightning's own 2)")
    checks.check(not [l for l in out.splitlines() if "spawnpoint-shim: Lightning" in l],
                 "without the shim: no mapping line")
    return checks.finish()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--pool":
        return run_pool(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "--unhooked":
        return run_unhooked(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "--devices":
        return run_devices(int(sys.argv[2]))
    if len(sys.argv) != 2:
        raise SystemExit("usage: lightning_under_agent.py STRATEGY | --library-strategy | "
                         "--devices N | --unhooked S | --pool S")
    return run_strategy(sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
