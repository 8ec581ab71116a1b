#!/usr/bin/python3
"""The chaos run's private /dev/shm works with and without root (issue 38): chaos.py
--check-private-shm enters the run's own mount namespace (and, without root, a user
namespace of its own too), checks that /dev/shm there is its own tmpfs of --shm-mb, fills it
to --shm-left-kb free as the shm-full fault does, and frees it. Run as this user and, when
this user is root, also as nobody (uid 65534, through setpriv), the path a run without root
takes. Standard library only; a few seconds.

    private_shm_test.py --source-dir REPO --build-dir BUILD
"""

import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NOBODY = 65534


def run_check(prefix, args):
    argv = prefix + [sys.executable, os.path.join(HERE, "chaos.py"), "--source-dir",
                     args.source_dir, "--build-dir", args.build_dir, "--check-private-shm",
                     "--shm-mb", "64"]
    print("running: %s" % " ".join(argv))
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120, cwd="/")
    print(proc.stdout.rstrip())
    return proc.returncode == 0 and "PASS: " in proc.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    args.source_dir, args.build_dir = map(os.path.abspath, (args.source_dir, args.build_dir))
    ok = run_check([], args)
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            print("FAIL: no setpriv (util-linux) to run the check as uid %d" % NOBODY)
            return 1
        ok = run_check(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
                        "--clear-groups"], args) and ok
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
