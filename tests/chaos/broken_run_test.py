#!/usr/bin/python3
"""A chaos run fails for a fault it could not inject and for a file left behind (issue 38).

    broken_run_test.py --source-dir REPO --build-dir BUILD

Runs chaos.py --unreachable-fault --leave-file: the real control plane, operator and agents,
one short retryable job and one fault planned for it, a rank SIGKILLed on node 2 of a
two-node job, which no process can ever receive; once the job is done a file is left in the
agents' TMPDIR, as an agent that did not clean up would leave it. The run must exit 1 and
say it failed for exactly those two reasons (`chaos run FAILED: 1 leak, 1 fault missed`:
each alone fails a run, neither is only listed), its summary line (printed last and written
to --summary-file) must hold `leaks=1`, `rank-kill=0/1` and end `missed=1`, and nothing else
may be wrong (the job Succeeded, no wrong phase, no error of the run's own). Standard library
only; about 40 s.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def check(output, code, summary):
    """The problems with a run's (output, exit code, summary file's text): [] when it failed
    for its missed fault and its leftover file and nothing else."""
    problems = []
    lines = output.strip().splitlines()
    last = lines[-1] if lines else ""
    if code != 1:
        problems.append("exit code %d, expected 1 (a planned fault was missed)" % code)
    if not last.startswith("chaos seed="):
        problems.append("the last line is not the summary line: %r" % last)
    if summary.strip() != last:
        problems.append("--summary-file holds %r, the last line is %r" % (summary, last))
    want = [r" succeeded=1 ", r" wrong_phase=0 ", r" leaks=1 ", r" rank-kill=0/1 ",
            r" missed=1$"]
    problems += ["the summary line lacks %r: %s" % (w, last) for w in want
                 if not re.search(w, last)]
    if not re.search(r"^  MISSED: rank-kill \(job chaos-0\): the job ended first", output,
                     re.M):
        problems.append("no 'MISSED: rank-kill (job chaos-0): the job ended first' line")
    if not re.search(r"^  after the run: left in the agents' TMPDIR: left-by-leave-file$",
                     output, re.M):
        problems.append("the file left in the agents' TMPDIR is not listed as a leak")
    if "chaos run FAILED: 1 leak, 1 fault missed\n" not in output:
        problems.append("no 'chaos run FAILED: 1 leak, 1 fault missed' line")
    problems += ["the run had an error of its own: %s" % l for l in lines
                 if l.startswith("ERROR:")]
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-broken-") as tmp:
        summary_file = os.path.join(tmp, "summary.txt")
        argv = [sys.executable, os.path.join(HERE, "chaos.py"), "--source-dir",
                args.source_dir, "--build-dir", args.build_dir, "--unreachable-fault", "--leave-file",
                "--seed", "1", "--steps", "20", "--summary-file", summary_file]
        print("running: %s" % " ".join(argv))
        sys.stdout.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=600)
        print(proc.stdout)
        summary = ""
        if os.path.exists(summary_file):
            with open(summary_file) as f:
                summary = f.read()
    problems = check(proc.stdout, proc.returncode, summary)
    for p in problems:
        print("FAIL: %s" % p)
    if not problems:
        print("PASS: the run with a fault that can never be injected and a file left behind "
              "failed, for those two reasons alone")
        # The failing run kept its logs (logs: WORK/cluster); the test is over, they go.
        for line in proc.stdout.splitlines():
            if line.startswith("logs: ") and "/spawnpoint-chaos-" in line:
                shutil.rmtree(os.path.dirname(line[len("logs: "):]), ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
