"""The chart's alerts (charts/spawnpoint/templates/prometheusrule.yaml, issue 41), as the real
helm 3 or helm 4 renders them with `helm template`:

- RulesTest: the PrometheusRule's groups, extracted, pass `promtool check rules`, then
  `promtool test rules` runs them on synthetic series of the operator's metrics
  (docs/metrics.md): each alert fires for its case, with its labels and its annotations as
  Prometheus expands them (naming the namespace and the job), and stays silent where it must:
  a straggler (condition Straggler, reason SlowerThanPeers) is not a hang; a stalled rank of a job
  that has failed is history; a job pending less than the threshold; a standby replica beside
  a leader; a leader of another release.
- ValuesTest: thresholds, `for` durations, severities and labels from the values; an alert
  turned off; the chart's refusals (no Prometheus Operator API, honorLabels off, every alert
  off, a malformed duration).

    python3 alerts_test.py --source-dir REPO --helm helm3 [unittest args]
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

import helm_chart
from helm_chart import NS, refusal, render

MONITORING = ("--api-versions", "monitoring.coreos.com/v1")
ALERTS = ["TrainingJobFailed", "TrainingJobStalled", "TrainingJobQuotaExceeded",
          "TrainingJobPendingTooLong", "SpawnpointOperatorDown"]


def prometheus_rule(*values):
    """The one PrometheusRule the chart renders with alerts on and `values`."""
    rules = [d for d in render("--set", "alerts.enabled=true", *(MONITORING + values))
             if d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise AssertionError("expected one PrometheusRule, got %d" % len(rules))
    return rules[0]


def rules_by_alert(rule):
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def expand(template, labels, value=None):
    """An annotation as Prometheus expands it, for the constructs the chart uses: $labels.X
    and `$value | humanizeDuration` (given as `value`, already humanized). Any other template
    construct fails the test, so that nothing the chart adds goes unchecked."""
    def label(m):
        if m.group(1) not in labels:
            raise AssertionError("annotation uses $labels.%s, which the alert has not: %r"
                                 % (m.group(1), template))
        return labels[m.group(1)]
    out = re.sub(r"\{\{ \$labels\.([a-z_]+) \}\}", label, template)
    if value is not None:
        out = out.replace("{{ $value | humanizeDuration }}", value)
    if "{{" in out:
        raise AssertionError("annotation constructs this test does not expand: %r" % out)
    return out


def promtool(*argv):
    p = subprocess.run(["promtool"] + list(argv), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    return p.returncode, p.stdout


# The operator's series as the ServiceMonitor stores them (honorLabels): the job's namespace
# and job, and the operator pod's target labels, which the alerts aggregate away.
TARGET = 'instance="10.0.0.7:8080",pod="spawnpoint-6d9f-abcde",service="spawnpoint-metrics"'


def condition(namespace, job, type_, reason):
    return ('spawnpoint_job_condition{namespace="%s",job="%s",type="%s",reason="%s",%s}'
            % (namespace, job, type_, reason, TARGET))


def pending(namespace, job):
    return 'spawnpoint_job_pending_seconds{namespace="%s",job="%s",%s}' % (namespace, job, TARGET)


def leader(namespace, instance):
    return 'spawnpoint_leader{namespace="%s",instance="%s",job="spawnpoint-metrics"}' % (
        namespace, instance)


class RulesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="spawnpoint-alerts-")
        cls.rule = prometheus_rule()
        cls.alerts = rules_by_alert(cls.rule)
        cls.rules_file = os.path.join(cls.tmp, "rules.yaml")
        with open(cls.rules_file, "w") as f:
            yaml.safe_dump({"groups": cls.rule["spec"]["groups"]}, f, sort_keys=False)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertIsNotNone(shutil.which("promtool"), "promtool is not installed (Debian "
                             "package \"prometheus\", which scripts/install-deps.sh installs: "
                             "make deps)")

    def expected(self, alert, labels, value=None):
        """promtool's exp_labels and exp_annotations for `alert` firing with `labels`."""
        rule = self.alerts[alert]
        all_labels = dict(labels, **rule["labels"])
        annotations = {k: expand(v, all_labels, value) for k, v in rule["annotations"].items()}
        return {"exp_labels": all_labels, "exp_annotations": annotations}

    def run_promtool_tests(self, tests):
        test_file = os.path.join(self.tmp, "test-%s.yaml" % self.id().rsplit(".", 1)[-1])
        with open(test_file, "w") as f:
            yaml.safe_dump({"rule_files": [self.rules_file], "evaluation_interval": "1m",
                            "tests": tests}, f, sort_keys=False)
        code, out = promtool("test", "rules", test_file)
        self.assertEqual(code, 0, out)
        self.assertIn("SUCCESS", out)

    def test_promtool_checks_the_rendered_rules(self):
        self.assertEqual(self.rule["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(self.rule["metadata"]["namespace"], NS)
        self.assertEqual(sorted(self.alerts), sorted(ALERTS))
        code, out = promtool("check", "rules", self.rules_file)
        self.assertEqual(code, 0, out)
        self.assertIn("SUCCESS: %d rules found" % len(ALERTS), out)
        for name, rule in self.alerts.items():
            self.assertEqual(set(rule["annotations"]), {"summary", "description"}, name)
            if name != "SpawnpointOperatorDown":
                for text in rule["annotations"].values():
                    self.assertIn("{{ $labels.namespace }}", text, name)
                    self.assertIn("{{ $labels.job }}", text, name)
            self.assertIn("kubectl", rule["annotations"]["description"],
                          "%s: the description says what to look at" % name)

    def test_a_failed_job(self):
        labels = {"namespace": "team-a", "job": "resnet", "reason": "MaxRestartsReached"}
        self.assertEqual(expand(self.alerts["TrainingJobFailed"]["annotations"]["summary"],
                                labels),
                         "TrainingJob team-a/resnet failed (MaxRestartsReached)")
        self.run_promtool_tests([{
            "interval": "1m",
            "input_series": [
                {"series": condition("team-a", "resnet", "Failed", "MaxRestartsReached"),
                 "values": "1x20"},
                {"series": condition("team-a", "resnet", "Created", "GangCreated"),
                 "values": "1x20"},
                # Another job, running: not failed.
                {"series": condition("team-a", "bert", "Running", "GangRunning"),
                 "values": "1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "30s", "alertname": "TrainingJobFailed", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "TrainingJobFailed",
                 "exp_alerts": [self.expected("TrainingJobFailed", labels)]},
            ],
        }])

    def test_a_hung_rank_fires_and_a_straggler_does_not(self):
        hung = {"namespace": "team-a", "job": "hung"}
        self.run_promtool_tests([{
            "interval": "1m",
            "input_series": [
                {"series": condition("team-a", "hung", "Stalled", "RankStalled"),
                 "values": "1x20"},
                # A slow rank is not a hang.
                {"series": condition("team-a", "slow", "Straggler", "SlowerThanPeers"),
                 "values": "1x20"},
                # A job that failed on its stalled rank (stallPolicy.action Fail) keeps the
                # condition: TrainingJobFailed reports it, not this.
                {"series": condition("team-b", "ended", "Stalled", "RankStalled"),
                 "values": "1x20"},
                {"series": condition("team-b", "ended", "Failed", "NonRetryableFailure"),
                 "values": "1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "TrainingJobStalled", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "TrainingJobStalled",
                 "exp_alerts": [self.expected("TrainingJobStalled", hung)]},
            ],
        }, {
            # A straggler alone, for the whole window: nothing.
            "interval": "1m",
            "input_series": [
                {"series": condition("team-a", "slow", "Straggler", "SlowerThanPeers"),
                 "values": "1x60"},
            ],
            "alert_rule_test": [
                {"eval_time": "%dm" % m, "alertname": "TrainingJobStalled", "exp_alerts": []}
                for m in (5, 30, 60)
            ],
        }])

    def test_a_quota_denied_job(self):
        denied = {"namespace": "team-b", "job": "big"}
        self.run_promtool_tests([{
            "interval": "1m",
            "input_series": [
                {"series": condition("team-b", "big", "QuotaExceeded", "ExceededQuota"),
                 "values": "1x30"},
                # Denied, then suspended: not news.
                {"series": condition("team-b", "parked", "QuotaExceeded", "ExceededQuota"),
                 "values": "1x30"},
                {"series": condition("team-b", "parked", "Suspended", "JobSuspended"),
                 "values": "1x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "TrainingJobQuotaExceeded", "exp_alerts": []},
                {"eval_time": "16m", "alertname": "TrainingJobQuotaExceeded",
                 "exp_alerts": [self.expected("TrainingJobQuotaExceeded", denied)]},
            ],
        }])

    def test_pending_too_long_and_not_yet(self):
        # "long" has waited 3000 s at 0m, 60 s more each minute: over 3600 s after 10m, so
        # firing from 11m + for (1m). "short" reaches 1800 s at 30m: never.
        long_job = {"namespace": "team-a", "job": "long"}
        self.run_promtool_tests([{
            "interval": "1m",
            "input_series": [
                {"series": pending("team-a", "long"), "values": "3000+60x20"},
                {"series": pending("team-a", "short"), "values": "0+60x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "TrainingJobPendingTooLong", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "TrainingJobPendingTooLong",
                 "exp_alerts": [self.expected("TrainingJobPendingTooLong", long_job,
                                              value="1h 2m 0s")]},
                {"eval_time": "30m", "alertname": "TrainingJobPendingTooLong", "exp_alerts": []},
            ],
        }])

    def test_no_leading_operator(self):
        down = {}  # the rule's own labels only: severity, and the release namespace
        silent = [{"eval_time": "10m", "alertname": "SpawnpointOperatorDown", "exp_alerts": []}]
        fires = [{"eval_time": "4m", "alertname": "SpawnpointOperatorDown", "exp_alerts": []},
                 {"eval_time": "6m", "alertname": "SpawnpointOperatorDown",
                  "exp_alerts": [self.expected("SpawnpointOperatorDown", down)]}]
        self.run_promtool_tests([
            # A leader and a standby: fine.
            {"interval": "1m",
             "input_series": [{"series": leader(NS, "10.0.0.7:8080"), "values": "1x20"},
                              {"series": leader(NS, "10.0.0.8:8080"), "values": "0x20"}],
             "alert_rule_test": silent},
            # Both standing by: nobody writes status.
            {"interval": "1m",
             "input_series": [{"series": leader(NS, "10.0.0.7:8080"), "values": "0x20"},
                              {"series": leader(NS, "10.0.0.8:8080"), "values": "0x20"}],
             "alert_rule_test": fires},
            # Not scraped at all; another release's leader does not stand in for ours.
            {"interval": "1m",
             "input_series": [{"series": leader("other-release", "10.0.1.1:8080"),
                               "values": "1x20"}],
             "alert_rule_test": fires},
        ])


class ValuesTest(unittest.TestCase):
    def test_thresholds_durations_and_labels_come_from_the_values(self):
        rule = prometheus_rule(
            "--set", "alerts.jobPendingTooLong.thresholdSeconds=600",
            "--set", "alerts.jobPendingTooLong.for=0s",
            "--set", "alerts.jobStalled.for=2m",
            "--set", "alerts.operatorDown.severity=page",
            "--set", "alerts.ruleLabels.team=ml-platform",
            "--set", "alerts.labels.release=kube-prometheus-stack",
            "--set", "alerts.jobFailed.enabled=false")
        alerts = rules_by_alert(rule)
        self.assertNotIn("TrainingJobFailed", alerts)
        self.assertEqual(len(alerts), len(ALERTS) - 1)
        self.assertTrue(alerts["TrainingJobPendingTooLong"]["expr"].endswith("> 600"),
                        alerts["TrainingJobPendingTooLong"]["expr"])
        self.assertEqual(alerts["TrainingJobPendingTooLong"]["for"], "0s")
        self.assertIn("the threshold is 600s",
                      alerts["TrainingJobPendingTooLong"]["annotations"]["description"])
        self.assertEqual(alerts["TrainingJobStalled"]["for"], "2m")
        self.assertEqual(alerts["SpawnpointOperatorDown"]["labels"],
                         {"severity": "page", "namespace": NS, "team": "ml-platform"})
        self.assertEqual(alerts["TrainingJobStalled"]["labels"],
                         {"severity": "critical", "team": "ml-platform"})
        self.assertEqual(rule["metadata"]["labels"]["release"], "kube-prometheus-stack")

    def test_off_by_default(self):
        self.assertEqual([d for d in render(*MONITORING) if d.get("kind") == "PrometheusRule"], [])

    def test_refusals(self):
        self.assertIn("alerts.enabled is true but this cluster does not serve "
                      "monitoring.coreos.com/v1 (PrometheusRule)",
                      refusal("--set", "alerts.enabled=true"))
        self.assertIn("alerts.enabled needs metrics.serviceMonitor.honorLabels",
                      refusal("--set", "alerts.enabled=true", "--set",
                              "metrics.serviceMonitor.enabled=true", "--set",
                              "metrics.serviceMonitor.honorLabels=false", *MONITORING))
        off = []
        for name in ("jobFailed", "jobStalled", "jobQuotaExceeded", "jobPendingTooLong",
                     "operatorDown"):
            off += ["--set", "alerts.%s.enabled=false" % name]
        self.assertIn("every alert is off",
                      refusal("--set", "alerts.enabled=true", *(off + list(MONITORING))))
        # The schema's, naming the field (helm 3: alerts.x.y, helm 4: /alerts/x/y).
        self.assertRegex(refusal("--set", "alerts.jobStalled.for=5 minutes"),
                         r"alerts[./]jobStalled[./]for.*(?i:does not match pattern)")
        self.assertRegex(refusal("--set", "alerts.jobPendingTooLong.thresholdSeconds=0"),
                         r"alerts[./]jobPendingTooLong[./]thresholdSeconds.*(greater than "
                         r"0|exclusiveMinimum)")
        self.assertRegex(refusal("--set", "alerts.jobPendingTooLong.thresold=60"),
                         r"alerts[./]jobPendingTooLong.*(property|properties) '?thresold")


if __name__ == "__main__":
    helm_chart.main()
