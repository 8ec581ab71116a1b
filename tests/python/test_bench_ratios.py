"""The benches' `ratios` lines hold only like-for-like headline ratios (issue 38).

A headline ratio compares the same work done by the two sides it names. What also counts work
only one side does is printed on a `context` line, saying so: make bench-loader's
default_first_batch_rank_start (our C++ split rank, which loads libtorch, against a Python
rank that also pays its own `import torch`) and make bench-restart's inplace_vs_recreate_sim
(mostly the pod start latency the bench injects into Recreate's pods). The report functions
run here on made-up measurements (every figure 1.0), with nothing started. Standard library
only: python3 tests/python/test_bench_ratios.py
"""

import collections
import contextlib
import io
import os
import sys
import types
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))

import loader_bench_report  # noqa: E402  (bench/)
import restart_bench  # noqa: E402  (bench/)

# Every key a ratios line may hold, with why it is like-for-like; a key that is not here fails.
LIKE_FOR_LIKE = {
    # make bench-loader: the same workloads, batches, workers and prefetch on both sides.
    "first_batch": "our loader against PyTorch's DataLoader, each from creating its loader",
    "transfer": "steady batches/s, the same batches",
    "compute": "steady batches/s, the same batches",
    "epoch_boundary_ms": "our time lost at an epoch boundary, the reference's definition",
    "default_first_batch": "the agent's pool against stock DataLoader, from creating the loader",
    "py_first_batch": "one Python script, the pool against stock DataLoader, from iter()",
    "py_transfer": "one Python script, steady batches/s",
    "py_compute": "one Python script, steady batches/s",
    "py_epoch_boundary_ms": "one Python script, time lost at an epoch boundary",
    # make bench-restart: the same job on the same local nodes, in place or recreated.
    "inplace_vs_recreate": "Recreate's restart over InPlace's, no injected delay",
}


class Measured(dict):
    """One repetition's measurements: 1.0 for every key asked for."""

    def get(self, key, default=None):
        return 1.0


def keys(line, label):
    """The keys of a `label k=v k=v ...` line."""
    assert line.startswith(label + " "), line
    return [item.split("=", 1)[0] for item in line[len(label) + 1:].split() if "=" in item]


def printed(fn, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue().splitlines()


def lines_starting(lines, label):
    return [line for line in lines if line.startswith(label + " ")]


class LoaderBenchRatiosTest(unittest.TestCase):

    def report(self):
        r = loader_bench_report
        results = collections.defaultdict(lambda: [Measured()])
        a = types.SimpleNamespace(repeats=1, workers=2)
        configs = [r.OURS_BIN, r.OURS_SELF, r.OURS_LINKED, r.THEIRS]
        return printed(r.report, a, results, list(r.WORKLOADS), configs, list(r.WORKLOADS), 0.0,
                       list(r.WORKLOADS))

    def test_ratios_line_holds_only_like_for_like_keys(self):
        lines = self.report()
        ratios = lines_starting(lines, "ratios")
        self.assertEqual(len(ratios), 1, lines)
        self.assertEqual(lines[-1], ratios[0], "the ratios line is the last")
        got = keys(ratios[0], "ratios")
        self.assertEqual([k for k in got if k not in LIKE_FOR_LIKE], [], ratios[0])
        self.assertEqual(got, ["first_batch", "transfer", "compute", "epoch_boundary_ms",
                               "default_first_batch", "py_first_batch", "py_transfer",
                               "py_compute", "py_epoch_boundary_ms"])

    def test_rank_start_ratio_is_context_saying_what_it_compares(self):
        lines = self.report()
        context = lines_starting(lines, "context")
        self.assertEqual(len(context), 1, lines)
        self.assertTrue(context[0].startswith("context (not like-for-like) "), context[0])
        self.assertIn("default_first_batch_rank_start=1.00: ", context[0])
        self.assertIn("import torch", context[0])
        self.assertIn("libtorch", context[0])


class RestartBenchRatiosTest(unittest.TestCase):

    def summary(self):
        results = {(mode, delay): [(1.0, 0.5)] for mode in ("InPlace", "Recreate")
                   for delay in (0.0, 5.0)}
        return printed(restart_bench.summary, results, 1, 5.0)

    def test_ratios_line_holds_only_like_for_like_keys(self):
        lines = self.summary()
        ratios = lines_starting(lines, "ratios")
        self.assertEqual(len(ratios), 1, lines)
        self.assertEqual(lines[-1], ratios[0], "the ratios line is the last")
        got = keys(ratios[0], "ratios")
        self.assertEqual([k for k in got if k not in LIKE_FOR_LIKE], [], ratios[0])
        self.assertEqual(got, ["inplace_vs_recreate"])

    def test_simulated_latency_ratio_is_context_saying_what_it_compares(self):
        context = lines_starting(self.summary(), "context")
        self.assertEqual(len(context), 1)
        self.assertTrue(context[0].startswith("context (not like-for-like) "), context[0])
        self.assertIn("inplace_vs_recreate_sim=1.00: ", context[0])
        self.assertIn("5 s injected by the bench (SIMULATED)", context[0])


if __name__ == "__main__":
    unittest.main()
