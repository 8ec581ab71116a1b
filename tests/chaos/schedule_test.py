#!/usr/bin/python3
"""The chaos run's schedule and tally (tests/chaos/schedule.py), without a cluster: every API
rule fires only on requests the operator makes and every window is sure to hold; the first
window holds every API kind; the minimum per kind is what the schedule plans; a run that
missed a fault says so per kind and in `missed=N`. Standard library only; a second."""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schedule  # noqa: E402

SEEDS = range(300)


def rule_fields(spec):
    return dict(field.split("=", 1) for field in spec.split(","))


class ScheduleTest(unittest.TestCase):
    def test_api_rules_match_requests_the_operator_makes(self):
        # A rule on a verb the operator never uses (it never patches) can never fire.
        for seed in SEEDS:
            for job in schedule.make_schedule(seed, 240):
                for f in job["faults"]:
                    for kind, spec in f.get("rules", ()):
                        fields = rule_fields(spec)
                        verb = fields.get("verb", "*")
                        self.assertTrue(verb == "*" or verb in schedule.OPERATOR_VERBS,
                                        "seed %d: %s" % (seed, spec))
                        # Rate 1, a count: the first matching requests fail, for certain.
                        self.assertNotIn("rate", fields, "seed %d: %s" % (seed, spec))
                        self.assertGreaterEqual(int(fields["count"]), 1, spec)
                        if kind == "api-watch-cut":
                            self.assertEqual(verb, "watch", spec)
                        elif "code" in fields:
                            # A code on a watch would answer the request a cut rule chose.
                            self.assertNotIn(verb, ("watch", "*"), spec)

    def test_every_window_holds_an_operator_restart_and_then_its_jobs_restart(self):
        for seed in SEEDS:
            for job in schedule.make_schedule(seed, 240):
                kinds = [f["kind"] for f in job["faults"]]
                for k, kind in enumerate(kinds):
                    if kind != "api-faults":
                        continue
                    self.assertEqual(kinds[k + 1], "operator-kill", "seed %d: %s" % (seed, kinds))
                    self.assertIn(kinds[k + 2], schedule.RESTARTING,
                                  "seed %d: %s" % (seed, kinds))
                    self.assertLess(job["faults"][k + 1]["after"], job["faults"][k]["window"])

    def test_the_first_window_holds_every_api_kind(self):
        for seed in SEEDS:
            jobs = schedule.make_schedule(seed, 60)
            first = next(f for f in jobs[0]["faults"] if f["kind"] == "api-faults")
            self.assertEqual(sorted(k for k, _ in first["rules"]), sorted(schedule.API_KINDS))

    def test_the_minimum_is_what_the_schedule_plans(self):
        jobs = schedule.make_schedule(16, 60)  # chaos_short's
        plan = schedule.planned(jobs)
        self.assertEqual([k for k in schedule.KINDS if plan[k] < 1], [])
        self.assertEqual(plan["rank-kill"], 2)  # one under the full /dev/shm, the budget job's
        self.assertEqual(plan["api-window"], 1)
        self.assertEqual(plan["api-500"], 1)
        lines = schedule.schedule_lines(16, 60, jobs)
        self.assertTrue(lines[-1].startswith("minimum to inject: rank-kill=2 "), lines[-1])

    def test_the_unreachable_schedule_plans_a_rank_no_pod_has(self):
        (job,) = schedule.unreachable_schedule()
        self.assertEqual([(f["kind"], f["node"]) for f in job["faults"]], [("rank-kill", 2)])
        self.assertFalse(job["budget"])


class TallyTest(unittest.TestCase):
    def jobs(self):
        return [{"faults": [{"kind": "rank-kill"}, {"kind": "worker-stop"},
                            {"kind": "api-faults", "rules": [("api-500", "code=500"),
                                                             ("api-409", "code=409")]}]}]

    def test_everything_injected_ends_missed_0(self):
        t = schedule.Tally(self.jobs())
        for kind in ("rank-kill", "worker-stop", "api-window"):
            t.inject(kind)
        t.rule_read("api-500", 3)
        t.rule_read("api-409", 1)
        t.close()
        self.assertEqual(t.total_missed(), 0)
        line = t.per_kind() + " missed=%d" % t.total_missed()
        self.assertIn("rank-kill=1/0 worker-kill=0/0 worker-stop=1/0 ", line)
        self.assertIn("api-500=3/0 api-429=0/0 api-409=1/0 ", line)
        self.assertTrue(line.endswith(" missed=0"), line)

    def test_a_rule_that_never_fired_is_missed(self):
        t = schedule.Tally(self.jobs())
        for kind in ("rank-kill", "worker-stop", "api-window"):
            t.inject(kind)
        t.rule_read("api-500", 3)
        t.rule_read("api-409", 0, " (job chaos-0): code=409")
        t.close()
        self.assertEqual(t.total_missed(), 1)
        self.assertIn("api-409=0/1", t.per_kind())
        self.assertEqual(t.reasons,
                         [("api-409", "api-409 (job chaos-0): code=409 fired 0 times")])

    def test_faults_not_come_to_are_missed_at_the_close(self):
        t = schedule.Tally(self.jobs())
        t.inject("rank-kill")
        t.miss("worker-stop", "worker-stop (job chaos-0): the job ended first")
        t.close()  # the API window and its two rules: never came to
        self.assertEqual(t.total_missed(), 4)
        self.assertTrue(re.search(r"worker-stop=0/1 .*api-window=0/1 api-500=0/1 .*"
                                  r"api-409=0/1 ", t.per_kind()), t.per_kind())


if __name__ == "__main__":
    unittest.main()
