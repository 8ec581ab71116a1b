"""Issue 24: Ultralytics YOLO under the agent, in the frameworks environment, offline, on CPU.

    ultralytics_under_agent.py

Makes a small detection dataset (32 images of 64x64 with one to three boxes of two classes,
drawn with numpy and written with OpenCV, YOLO labels, a data YAML without `download:`), then
runs ultralytics_trainer.py (YOLO('yolov8n.yaml').train(...), 3 epochs, deterministic, seed 0,
the last epoch's DataLoader re-made by close_mosaic) as a 1-rank job twice: with the agent's
loader pool (workersPerRank 2) and with `loader.pythonPool: false` (stock DataLoader: spawn,
persistent workers). Checks: both jobs succeed; the pool served Ultralytics' InfiniteDataLoader
in every epoch (the same iterator until close_mosaic re-made it) and stock did not; the
losses of every epoch are equal on both sides; the pool's 2 workers were never restarted (the
same processes, so the same pids, through all epochs and the re-made loader); the agent's
status has the rank's loader statistics with a data-stall figure. Prints the time from
train() to the first batch on both sides (the bench row of bench/RESULTS.md).

Offline as Ultralytics allows: YOLO_OFFLINE=true, YOLO_AUTOINSTALL=false, a fresh
YOLO_CONFIG_DIR that already holds the font Ultralytics checks for (check_font is not gated by
offline mode; matplotlib's DejaVuSans stands in for Arial.ttf, which nothing draws with here).
"""

import json
import os
import sys

sys.path.insert(0, "/opt/spawnpoint-foreign")
import foreign_common as fc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "ultralytics_trainer.py")
WORK = "/tmp/yolo"
sys.path.insert(0, HERE)
from ultralytics_trainer import IMAGES, make_dataset, offline_env  # noqa: E402


def record_of(out):
    for line in out.splitlines():
        at = line.find("SPAWNPOINT-YOLO ")
        if at >= 0:
            return json.loads(line[at + len("SPAWNPOINT-YOLO "):])
    return None


def run(name, data, env, pool):
    job = fc.job_yaml(name, [sys.executable, TRAINER, data, os.path.join(WORK, name)],
                      procs=1, workers=2, python_pool=pool)
    status = os.path.join(WORK, name + "-status.json")
    proc = fc.run_agent(job, args=["--status-file", status], env=env)
    out = proc.stdout + proc.stderr
    sys.stdout.write(out)
    return proc, out, status


def main():
    checks = fc.Checks("ultralytics_under_agent")
    data = make_dataset(WORK)
    env = offline_env(WORK)
    pool_proc, pool_out, pool_status = run("yolo-pool", data, env, True)
    stock_proc, stock_out, _ = run("yolo-stock", data, env, False)
    checks.equal(pool_proc.returncode, 0, "the job with the agent's pool: exit status")
    checks.equal(stock_proc.returncode, 0, "the job with stock DataLoader: exit status")
    pool, stock = record_of(pool_out), record_of(stock_out)
    if not checks.check(pool is not None and stock is not None, "both trainers finished"):
        return checks.finish()
    print("ultralytics %s, torch %s" % (pool["ultralytics"], pool["torch"]))
    iterators = pool["iterators"]
    checks.equal([i[0] for i in iterators], ["_PoolDataLoaderIter"] * 3,
                 "the pool served the train loader in every epoch")
    checks.check(iterators[0][1] == iterators[1][1] != iterators[2][1],
                 "one iterator for epochs 1-2, a new one after close_mosaic re-made the loader: %s"
                 % iterators)
    checks.equal([i[0] for i in stock["iterators"]], ["_MultiProcessingDataLoaderIter"] * 3,
                 "pythonPool: false: torch's own workers in every epoch")
    checks.equal(pool["workers"], [2, 2, 2], "DataLoader workers per epoch (turned on on CPU)")
    checks.equal(pool["losses"], stock["losses"], "losses per epoch, pool against stock")
    checks.check(not [l for l in pool_out.splitlines() if "falls back" in l or "fall back" in l],
                 "no loader fell back to torch's workers")
    with open(pool_status) as f:
        loaders = json.load(f)["loader"]
    checks.equal([l["rank"] for l in loaders], [0], "ranks with a loader pool")
    if loaders:
        stats, workers = loaders[0].get("stats", {}), loaders[0]["pool"]["workers"]
        checks.equal([(w["incarnation"], w["exits"]) for w in workers], [(0, 0), (0, 0)],
                     "its 2 workers never restarted: the same processes all through")
        # 3 epochs of 8 batches of 4, then the 8 batches of the validation of best.pt that
        # Ultralytics runs after training (val=False skips only the per-epoch ones).
        checks.equal(stats.get("batches"), 3 * IMAGES // 4 + IMAGES // 4,
                     "batches the trainer took from it")
        checks.check(isinstance(stats.get("dataStall"), (int, float)),
                     "the rank's data-stall figure: %r" % stats.get("dataStall"))
    print("SPAWNPOINT-BENCH ultralytics train() -> first batch: pool %.2f s, stock %.2f s"
          % (pool["first_batch_s"], stock["first_batch_s"]))
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
