"""Issue 24: Lightning's DDP strategies under the agent, in the frameworks environment.

    lightning_under_agent.py STRATEGY        a 2-rank job (gloo, CPU) of lightning_trainer.py
    lightning_under_agent.py --devices N     strategy ddp, Trainer(devices=N) against 2 ranks
    lightning_under_agent.py --unhooked S    the control: S with the shim off (SPAWNPOINT_SHIM=0)
    lightning_under_agent.py --pool S        S with workersPerRank: 2: the agent's pool serves
                                             Lightning's DataLoader (its re-made one, with a
                                             DistributedSampler)

For STRATEGY (ddp, ddp_spawn, ddp_fork, ddp_notebook, auto) the job exits 0 and: exactly the
agent's 2 ranks ran training steps (no second set of ranks: no other process stepped), each
rank's parent is the agent (the same process for both, neither a rank), no process was forked
(no 'SPAWNPOINT-FORKED' line: os.register_at_fork in the trainer) and no rank has a child
left, Lightning used DDPStrategy with start method 'popen', the TorchElasticEnvironment and
no launching, both ranks ended with the same parameters, each rank's 8 optimizer steps were
counted with their wait for DDP's allreduce (issue 13), and the shim's mapping line was
printed exactly once. With --devices N (N != 2) the job fails at Trainer creation with the
shim's error naming the values and the trainer's line. The control (--unhooked ddp_fork)
shows that these checks see what Lightning does without the shim: each rank forks its own 2
DDP processes (4 'SPAWNPOINT-FORKED' lines), whatever becomes of them afterwards.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, "/opt/spawnpoint-foreign")
import foreign_common as fc  # noqa: E402

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_trainer.py")


def lines(out, tag):
    found = []
    for line in out.splitlines():
        at = line.find(tag + " ")
        if at >= 0:
            found.append(json.loads(line[at + len(tag) + 1:]))
    return found


def run_strategy(strategy):
    checks = fc.Checks("lightning_under_agent %s" % strategy)
    job = fc.job_yaml("lightning-" + strategy.replace("_", "-"),
                      [sys.executable, TRAINER, strategy], procs=2, workers=0)
    status = "/tmp/lightning-%s-status.json" % strategy
    proc = fc.run_agent(job, args=["--status-file", status])
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
                     ("DDPStrategy", "popen", "TorchElasticEnvironment", 2),
                     "rank %s: strategy, start method, cluster environment, world size"
                     % f["rank_env"])
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
                            "ddp); nothing is forked"}[strategy]
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


def run_pool(strategy):
    checks = fc.Checks("lightning_under_agent --pool %s" % strategy)
    job = fc.job_yaml("lightning-pool", [sys.executable, TRAINER, strategy], procs=2, workers=2)
    status = "/tmp/lightning-pool-status.json"
    proc = fc.run_agent(job, args=["--status-file", status])
    out = proc.stdout + proc.stderr
    sys.stdout.write(out)
    if not checks.equal(proc.returncode, 0, "spawnpoint-agent run exit status"):
        return checks.finish()
    finals = lines(proc.stdout, "SPAWNPOINT-LIGHTNING")
    checks.equal(sorted(f["rank_env"] for f in finals), ["0", "1"], "ranks that finished fit()")
    checks.equal(lines(proc.stdout, "SPAWNPOINT-FORKED"), [], "processes created by fork()")
    checks.equal([f["children"] for f in finals], [[]] * len(finals),
                 "ranks' child processes (the workers are the agent's)")
    if len(finals) == 2:
        checks.equal(finals[0]["params"], finals[1]["params"], "both ranks' final parameters")
    with open(status) as f:
        loaders = json.load(f)["loader"]
    checks.equal(sorted(l["rank"] for l in loaders), [0, 1], "ranks with a loader pool")
    for l in sorted(loaders, key=lambda l: l["rank"]):
        # 64 samples, DistributedSampler over 2 ranks, batch 8: 4 batches a rank per epoch.
        checks.equal((l["stats"]["batches"], l["stats"]["samples"]), (8, 64),
                     "rank %d: batches and samples the pool served in 2 epochs" % l["rank"])
        checks.equal([(w["incarnation"], w["exits"]) for w in l["pool"]["workers"]],
                     [(0, 0), (0, 0)], "rank %d: its 2 workers, never restarted" % l["rank"])
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
        raise SystemExit("usage: lightning_under_agent.py STRATEGY | --devices N | "
                         "--unhooked S | --pool S")
    return run_strategy(sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
