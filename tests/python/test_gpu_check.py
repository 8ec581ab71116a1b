"""The project's GPU check (bench/gpu/gpu-check.sh) on fakes, so that it cannot rot where CI has
no GPU: fake NVML (tests/fakes/fake_nvml.c, 8 A100s) for the agent, tests/fakes/nvidia-smi
answering from the same file, Debian's torch on the CPU (gloo) for the ranks and torchrun.
It must pass when the two agree and fail, naming the disagreement, when they do not.

    python3 tests/python/test_gpu_check.py --bundle BUILD_DIR --nvml-library LIB
"""

import argparse
import os
import re
import subprocess
import sys
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ARGS = None
TIMEOUT_S = 600


def gpu_check(extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPAWNPOINT_")}
    env["FAKE_NVML_CONFIG"] = os.path.join(REPO, "tests", "fakes", "nvml",
                                           "eight_gpus_two_numa.conf")
    env.update(extra_env or {})
    p = subprocess.run(
        ["bash", os.path.join(REPO, "bench", "gpu", "gpu-check.sh"), "--bundle", ARGS.bundle,
         "--python", sys.executable, "--nvidia-smi",
         os.path.join(REPO, "tests", "fakes", "nvidia-smi"), "--", "--gpu-backend", "nvml",
         "--nvml-library", ARGS.nvml_library],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
        timeout=TIMEOUT_S)
    return p.returncode, p.stdout


class GpuCheckTest(unittest.TestCase):
    def test_agreeing_fakes_pass_with_one_table(self):
        code, out = gpu_check()
        self.assertEqual(code, 0, out)
        last = out.strip().splitlines()[-1]
        self.assertRegex(last, r'^gpu-check device="NVIDIA A100-SXM4-80GB" gpus=2 plan=ok '
                               r'ddp=ok metrics=ok notebook=n/a first_step=[0-9.]+/[0-9.]+ '
                               r'restart=[0-9.]+/[0-9.]+$', out)
        # The notebook case ran as far as this python allows, and said why not further:
        # Debian's python3 has no Lightning (the frameworks tests run that notebook).
        self.assertRegex(out, r"\| Lightning ddp_notebook in a kernel \| n/a: \S+ has no "
                              r"lightning", out)
        self.assertIn("| plan vs nvidia-smi | ok: 2 GPU(s): UUIDs, bus ids, memory agree |", out)
        # Both GPUs the job had, each with the fake's values on both sides.
        self.assertIn("memory 2048/81920 MiB (nvidia-smi 2048/81920 MiB), utilisation 20 %", out)
        self.assertIn("memory 4096/81920 MiB (nvidia-smi 4096/81920 MiB), utilisation 40 %", out)
        for phase in ("import_torch", "init_process_group", "ddp", "first_step",
                      "rank death -> restarted first step"):
            self.assertRegex(out, r"\| %s \| [0-9.]+ s \| [0-9.]+ s \|" % re.escape(phase), out)

    def test_an_nvidia_smi_that_disagrees_fails_the_check_and_says_where(self):
        code, out = gpu_check({"FAKE_NVIDIA_SMI_MEMORY_SKEW_MIB": "1024"})
        self.assertEqual(code, 1, out)
        self.assertRegex(out.strip().splitlines()[-1],
                         r" plan=FAIL ddp=ok metrics=FAIL notebook=n/a ", out)
        self.assertIn("81920 MiB, nvidia-smi 82944 MiB", out)
        self.assertIn("memory total 81920 MiB, nvidia-smi 82944 MiB", out)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", required=True, help="a directory with bin/spawnpoint-agent")
    parser.add_argument("--nvml-library", required=True, help="the fake libnvidia-ml")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
