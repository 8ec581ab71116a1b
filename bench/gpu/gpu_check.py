"""The project's GPU check (bench/gpu/gpu-check.sh runs it): the agent bundle against what
nvidia-smi says, on a machine with NVIDIA GPUs and a python3 with CUDA torch, in one run of
well under 5 minutes, ending in one table.

  1. plan: `spawnpoint-agent plan` for a job of N ranks x 1 GPU (N = the GPUs, at most 2)
     names GPUs that nvidia-smi lists, with the same UUIDs, PCI bus ids and memory.
  2. DDP job: bench/restart_scripts/ddp_torchvision.py under `spawnpoint-agent run` at its
     defaults (NCCL, its DataLoader's 2 workers in the agent's pool, standby ranks), its last
     rank SIGKILLed once every rank stepped and every standby is ready; the job must end 0.
  3. /metrics, scraped while that job runs, against nvidia-smi sampled at the same moment:
     each GPU's memory in all (equal) and in use (within 512 MiB or 10 %: the ranks allocate
     between the two readings), its utilisation shown; the pool's workers are up.
  4. The same script under torchrun of the same torch at its defaults: the first start's
     phases (import torch, first collective, DDP(model), first step) and the restart (the
     death -> the restarted first step), side by side.
  5. A Lightning notebook (issue 37): tests/notebook/test_lightning_notebook.py's
     test_ddp_notebook_with_the_extension on a real Jupyter kernel of this python, with
     accelerator="gpu" (cpu where torch sees no GPU): the kernel makes a CUDA context, then
     `%load_ext spawnpoint` and Trainer(strategy="ddp_notebook", devices=2).fit on the agent's
     ranks, and the kernel's model ends with rank 0's weights. n/a, with the reason, where this
     python lacks lightning, ipykernel or nbclient (the fakes' Debian python).

Exit status 0 when every check holds, 1 when one does not (the table says which), 2 when the
check could not run. The last line is

    gpu-check device="NAME" gpus=N plan=ok|FAIL ddp=ok|FAIL metrics=ok|FAIL notebook=ok|FAIL|n/a first_step=A/B restart=C/D

(A, C: the agent's seconds; B, D: torchrun's). Where there is no GPU it runs on fakes the
same way (make test: tests/python/test_gpu_check.py, fake NVML and nvidia-smi, torch on the
CPU with gloo), so it cannot rot.

    python3 bench/gpu/gpu_check.py --agent PATH [--nvidia-smi CMD] [-- AGENT_FLAGS...]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: restart_vs_torchrun
import restart_vs_torchrun as rvt  # noqa: E402

MIB = 1 << 20
METRICS_LINE = re.compile(r"metrics on http://[^ ]*:(\d+)/metrics")
SAMPLE = re.compile(r'^(spawnpoint_\w+)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def smi(nvidia_smi, fields):
    out = subprocess.run([nvidia_smi, "--query-gpu=" + ",".join(fields),
                          "--format=csv,noheader,nounits"], check=True, timeout=60,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    return [dict(zip(fields, (v.strip() for v in line.split(","))))
            for line in out.splitlines() if line.strip()]


def bus(text):
    """nvidia-smi's 00000000:07:00.0 and the agent's 0000:07:00.0 alike: 0000:07:00.0."""
    parts = text.lower().split(":")
    return ":".join([parts[0][-4:]] + parts[1:])


def check_plan(agent, agent_args, gpus, n):
    job = rvt.JOB % (n, n, json.dumps(["/bin/true"]))
    with tempfile.TemporaryDirectory(prefix="spawnpoint-gpu-check-") as tmp:
        with open(os.path.join(tmp, "job.yaml"), "w") as f:
            f.write(job)
        p = subprocess.run([agent, "plan", "-f", os.path.join(tmp, "job.yaml"), "--node-rank",
                            "0"] + agent_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
    if p.returncode != 0:
        return False, "plan failed: " + p.stderr.strip()
    by_uuid = {g["uuid"]: g for g in gpus}
    devices = {}  # each GPU once (a rank may see its peers' too)
    for r in json.loads(p.stdout)["ranks"]:
        for d in r["devices"]:
            devices.setdefault(d["uuid"], d)
    problems = []
    for uuid, d in sorted(devices.items()):
        g = by_uuid.get(uuid)
        if g is None:
            problems.append("%s is not in nvidia-smi's list" % uuid)
            continue
        if bus(d["pciBusId"]) != bus(g["pci.bus_id"]):
            problems.append("%s: bus %s, nvidia-smi %s" % (uuid, d["pciBusId"], g["pci.bus_id"]))
        if d.get("memoryTotalBytes", 0) // MIB != int(g["memory.total"]):
            problems.append("%s: %d MiB, nvidia-smi %s MiB" % (
                uuid, d.get("memoryTotalBytes", 0) // MIB, g["memory.total"]))
    if len(devices) != n:
        problems.append("%d distinct GPUs for %d ranks" % (len(devices), n))
    return not problems, "; ".join(problems) or "%d GPU(s): UUIDs, bus ids, memory agree" % n


def scrape(port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read()
    samples = []
    for line in text.decode().splitlines():
        m = SAMPLE.match(line)
        if m:
            samples.append((m.group(1), dict(LABEL.findall(m.group(2))), float(m.group(3))))
    return samples


class MetricsCheck:
    """Called by the bench once every rank has stepped: /metrics and nvidia-smi, together."""

    def __init__(self, nvidia_smi):
        self.nvidia_smi = nvidia_smi
        self.rows, self.problems, self.done = [], [], False

    def __call__(self, text):
        m = METRICS_LINE.search(text)
        if not m:
            self.problems.append("the agent did not say where /metrics is")
            return
        samples = scrape(int(m.group(1)))
        gpus = smi(self.nvidia_smi, ["uuid", "memory.total", "memory.used", "utilization.gpu"])
        self.done = True

        def value(name, uuid):
            for n, labels, v in samples:
                if n == name and labels.get("UUID") == uuid:
                    return v
            return None

        for g in gpus:
            total = value("spawnpoint_gpu_memory_total_bytes", g["uuid"])
            if total is None:
                continue  # a GPU no rank of the job has
            used = value("spawnpoint_gpu_memory_used_bytes", g["uuid"])
            util = value("spawnpoint_gpu_utilisation_ratio", g["uuid"])
            smi_used = int(g["memory.used"])
            self.rows.append("%s: memory %d/%d MiB (nvidia-smi %d/%s MiB), utilisation %s %% "
                             "(nvidia-smi %s %%)" % (
                                 g["uuid"], (used or 0) // MIB, total // MIB, smi_used,
                                 g["memory.total"], "?" if util is None else round(util * 100),
                                 g["utilization.gpu"]))
            if int(total) // MIB != int(g["memory.total"]):
                self.problems.append("%s: memory total %d MiB, nvidia-smi %s MiB" % (
                    g["uuid"], total // MIB, g["memory.total"]))
            if used is None or abs(used / MIB - smi_used) > max(512, 0.1 * smi_used):
                self.problems.append("%s: memory used %s MiB, nvidia-smi %d MiB" % (
                    g["uuid"], None if used is None else int(used // MIB), smi_used))
        if not self.rows:
            self.problems.append("no spawnpoint_gpu_* sample for any GPU nvidia-smi lists")
        workers = [v for n, labels, v in samples if n == "spawnpoint_loader_active_workers"]
        if not workers or min(workers) < 1:
            self.problems.append("the pool's workers are not up (spawnpoint_loader_active_"
                                 "workers %s)" % workers)


REPO = os.path.dirname(os.path.dirname(HERE))
NOTEBOOK_TEST = "LightningNotebookTest.test_ddp_notebook_with_the_extension"


def check_notebook(agent, gpu):
    """Check 5: (ok, n/a or FAIL, what to show)."""
    runner = os.path.join(REPO, "tests", "notebook", "run_notebook_tests.py")
    python_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(agent))),
                              "share", "spawnpoint", "python")
    env = dict(os.environ, SPAWNPOINT_NOTEBOOK_ACCELERATOR="gpu" if gpu else "cpu")
    started = time.time()
    try:
        p = subprocess.run([sys.executable, runner, "--agent", agent, "--python-dir", python_dir,
                            "--require", "lightning", "--require", "ipykernel", "--require",
                            "nbclient", NOTEBOOK_TEST], env=env, timeout=600,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
    except subprocess.TimeoutExpired:
        return "FAIL", "no result within 600 s"
    if p.returncode == 77:
        skip = [l for l in p.stdout.splitlines() if l.startswith("SKIP:")]
        return "n/a", (skip or ["skipped"])[0][len("SKIP: "):]
    if p.returncode != 0:
        print("notebook case failed:\n" + p.stdout[-6000:], flush=True)
        return "FAIL", why(p.stdout)
    return "ok", "%s ranks, the kernel's model has rank 0's weights (%.0f s)" % (
        "GPU" if gpu else "CPU", time.time() - started)


def why(failure):
    """The line of a failed run that says why: the agent's error, else the first."""
    lines = [l for l in failure.splitlines() if l.strip()]
    errors = [l for l in lines if "error" in l.lower()]
    return (errors or lines or ["?"])[0].strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", required=True)
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("agent_args", nargs="*", help="more spawnpoint-agent flags (after --)")
    args = parser.parse_args()
    started = time.time()
    try:
        import torch
    except ImportError as err:
        print("gpu-check: %s has no torch (%s)" % (sys.executable, err))
        return 2
    try:
        gpus = smi(args.nvidia_smi, ["index", "uuid", "pci.bus_id", "name", "memory.total"])
    except (OSError, subprocess.SubprocessError) as err:
        print("gpu-check: %s: %s" % (args.nvidia_smi, err))
        return 2
    if not gpus:
        print("gpu-check: nvidia-smi lists no GPU")
        return 2
    n = min(2, len(gpus))
    device = gpus[0]["name"]
    print("gpu-check: %d GPU(s) (%s), using %d; torch %s, CUDA %s; %s" % (
        len(gpus), device, n, torch.__version__, torch.cuda.is_available(), args.agent),
        flush=True)

    plan_ok, plan_text = check_plan(args.agent, args.agent_args, gpus, n)
    print("plan: " + plan_text, flush=True)

    metrics = MetricsCheck(args.nvidia_smi)
    agent_args = args.agent_args + ["--metrics-addr", "127.0.0.1:0"]
    results, failed = {}, {}
    for launcher in ("ours", "torchrun"):
        try:
            results[launcher] = rvt.run_once(launcher, "torchvision", args.agent, nproc=n, gpus=n,
                                             agent_args=agent_args,
                                             during=metrics if launcher == "ours" else None)
        except rvt.RunFailed as err:
            failed[launcher] = str(err)
            print("%s run failed:\n%s" % (launcher, err), flush=True)
    ddp_ok = "ours" in results
    metrics_ok = ddp_ok and metrics.done and not metrics.problems
    notebook, notebook_text = check_notebook(args.agent, torch.cuda.is_available())
    print("notebook: %s: %s" % (notebook, notebook_text), flush=True)

    def cell(launcher, key, phase=None):
        r = results.get(launcher)
        if r is None:
            return "failed"
        v = r["phases"].get(phase) if phase else r[key]
        return "-" if v is None else "%.2f s" % v

    print("\n| check | result |\n| --- | --- |")
    print("| plan vs nvidia-smi | %s: %s |" % ("ok" if plan_ok else "FAIL", plan_text))
    print("| NCCL DDP job, pool, SIGKILL restart | %s |" % (
        "ok (exit 0)" if ddp_ok else "FAIL: " + why(failed["ours"])))
    print("| /metrics vs nvidia-smi | %s |" % (
        ("ok: " if metrics_ok else "FAIL: ") +
        "; ".join(metrics.problems + metrics.rows)))
    print("| Lightning ddp_notebook in a kernel | %s: %s |" % (notebook, notebook_text))
    print("\n| from launch, seconds | spawnpoint-agent | torchrun |\n| --- | --- | --- |")
    phases = results["ours"]["phases"] if ddp_ok else {}
    for phase in phases:
        print("| %s | %s | %s |" % (phase, cell("ours", None, phase),
                                    cell("torchrun", None, phase)))
    print("| rank death -> restarted first step | %s | %s |" % (
        cell("ours", "restart"), cell("torchrun", "restart")))
    print("\ngpu-check took %.0f s" % (time.time() - started))

    def pair(key):
        return "%s/%s" % tuple(
            ("%.2f" % results[l][key]) if l in results else "failed" for l in ("ours", "torchrun"))

    print('gpu-check device="%s" gpus=%d plan=%s ddp=%s metrics=%s notebook=%s first_step=%s '
          'restart=%s' % (device, n, "ok" if plan_ok else "FAIL", "ok" if ddp_ok else "FAIL",
                          "ok" if metrics_ok else "FAIL", notebook, pair("start"),
                          pair("restart")))
    return 0 if plan_ok and ddp_ok and metrics_ok and notebook != "FAIL" else 1


if __name__ == "__main__":
    sys.exit(main())
