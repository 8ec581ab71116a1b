"""Status marked stale while no operator runs (issue 41), on the real control plane: the chart
installed with the real helm (its Deployments parked: the local node runs no images), then the
operator and the status watchdog run from the build with the installed Deployments' arguments
and each with its own installed ServiceAccount's token (the chart's RBAC for real), the
operator's Lease short (4 s) and the watchdog's staleAfter 10 s.

- While the operator runs, no job is marked (the Lease is renewed every second).
- The operator killed (SIGKILL: no Lease handed over), the running job gets StatusStale=True
  (OperatorNotRunning, naming the Lease and the phase its status still holds), a StatusStale
  Warning event and True in `kubectl get tj`'s STALE column, never sooner than staleAfter
  after the last renewal could have been; the job that had Succeeded is not marked.
- An operator started again takes the Lease and sets it False (OperatorRunning, a
  StatusCurrent event); the job then runs to Succeeded.
- The API server refused none of the watchdog's requests (its audit log).

    python3 test_status_watchdog_on_real_server.py --source-dir REPO --build-dir BUILD --helm helm4
"""

import json
import os
import re
import time
import unittest

import cluster_fixture
from cluster_fixture import wait_until

NS = "spawnpoint-system"
RELEASE = "spawnpoint"
TEAM = "team-a"
WATCHDOG = RELEASE + "-status-watchdog"
STALE_AFTER_S = 10
RETRY_PERIOD_S = 1
INTERVAL_S = 1
DEADLINE_S = 180
# The operator's flags the test replaces with its own (cluster_fixture.start_operator); the
# status-token key: the operator makes its own (the mounted Secret is not here).
LOCAL_FLAGS = ("--metrics-addr", "--health-addr", "--agent-status-port", "--utilisation-interval",
               "--status-token-key-file")


def args():
    return cluster_fixture.ARGS


class StatusWatchdogOnRealServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster_fixture.Cluster(args().source_dir, args().tools_bin, nodes=1)
        cls.tmp = cls.cluster.dir
        try:
            cls.kubectl_ok("create", "namespace", TEAM)
            cls.cluster.install_chart(
                args().helm, RELEASE, NS,
                "--set", "watchNamespaces={%s}" % TEAM,
                "--set", "leaderElection.leaseDuration=4s",
                "--set", "leaderElection.renewDeadline=3s",
                "--set", "leaderElection.retryPeriod=%ds" % RETRY_PERIOD_S,
                "--set", "statusWatchdog.staleAfter=%ds" % STALE_AFTER_S,
                "--set", "statusWatchdog.interval=%ds" % INTERVAL_S)
            cls.cluster.wait_established("trainingjobs.spawnpoint.dev")
            manifest = cls.cluster.helm(args().helm, "get", "manifest", RELEASE, "-n", NS)
            import yaml
            cls.deployments = {d["metadata"]["name"]: d for d in yaml.safe_load_all(manifest)
                               if d and d["kind"] == "Deployment"}
            cls.watchdog = cls.start_watchdog()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    @classmethod
    def kubectl_ok(cls, *argv, stdin=None):
        return cluster_fixture.kubectl_ok(cls.cluster, *argv, stdin=stdin)

    @classmethod
    def container_args(cls, name):
        return cls.deployments[name]["spec"]["template"]["spec"]["containers"][0]["args"]

    @classmethod
    def start_watchdog(cls):
        argv = [a.replace("$(POD_NAME)", "watchdog-test") for a in cls.container_args(WATCHDOG)]
        assert argv[0] == "status-watchdog", argv
        return cls.cluster.start_process("watchdog", [
            os.path.join(args().build_dir, "bin", "spawnpoint-operator")] + argv + [
            "--kubeconfig", cls.cluster.service_account_kubeconfig(NS, WATCHDOG)])

    def start_operator(self, name):
        operator_args = [a for a in self.container_args(RELEASE)
                         if not a.startswith(LOCAL_FLAGS)]
        self.assertIn("--leader-elect", operator_args)
        return self.cluster.start_operator(
            args().build_dir, kubeconfig=self.cluster.service_account_kubeconfig(NS, RELEASE),
            args=operator_args, name=name, crd=False)

    def job(self, name):
        return json.loads(self.kubectl_ok("get", "tj", name, "-n", TEAM, "-o", "json"))

    def stale(self, name):
        for c in self.job(name).get("status", {}).get("conditions") or []:
            if c["type"] == "StatusStale":
                return c
        return {}

    def events(self, name, reason):
        return json.loads(self.kubectl_ok(
            "get", "events", "-n", TEAM, "-o", "json", "--field-selector",
            "involvedObject.name=%s,reason=%s" % (name, reason)))["items"]

    def wait(self, what, check, deadline_s=DEADLINE_S):
        if not wait_until(check, deadline_s):
            logs = "\n".join("%s:\n%s" % (log, self.cluster.log(log)[-2500:])
                             for log in ("watchdog", "operator", "operator-2")
                             if os.path.exists(os.path.join(self.cluster.dir, log + ".log")))
            self.fail("%s not within %d s\n%s" % (what, deadline_s, logs))

    def watchdog_denials(self):
        user = "system:serviceaccount:%s:%s" % (NS, WATCHDOG)
        return ["%s %s -> %d" % (e.get("verb"), e.get("requestURI"),
                                 e["responseStatus"]["code"])
                for e in self.cluster.audit_events()
                if e.get("user", {}).get("username") == user and
                e.get("responseStatus", {}).get("code") in (401, 403)]

    def test_a_job_is_marked_stale_while_no_operator_runs_and_current_after(self):
        release = os.path.join(self.tmp, "release")
        trainer = cluster_fixture.example_trainer(args().build_dir)
        operator = self.start_operator("operator")
        self.kubectl_ok("create", "-f", "-", stdin=json.dumps(cluster_fixture.training_job(
            "short", TEAM, trainer, nodes=1)))
        self.wait("short Succeeded", lambda: self.job("short").get("status", {}).get(
            "phase") == "Succeeded")
        self.kubectl_ok("create", "-f", "-", stdin=json.dumps(cluster_fixture.training_job(
            "long", TEAM, ["bash", "-c", 'while [ ! -e "$0" ]; do sleep 0.1; done; exec "$@"',
                           release] + trainer, nodes=1)))
        self.wait("long Running", lambda: self.job("long").get("status", {}).get(
            "phase") == "Running")
        # The operator renews its Lease: nothing is marked over more than staleAfter.
        end = time.monotonic() + STALE_AFTER_S + 3
        while time.monotonic() < end:
            self.assertEqual(self.stale("long"), {})
            time.sleep(0.5)
        self.assertIn("watching the operator's Lease", self.cluster.log("watchdog"))

        operator.kill()  # no Lease handed over
        operator.wait()
        killed = time.monotonic()
        self.wait("StatusStale True", lambda: self.stale("long").get("status") == "True")
        # Never before staleAfter since the last renewal (at most a retry period before the
        # kill) and a read of the Lease (every interval): load only makes it later.
        self.assertGreaterEqual(time.monotonic() - killed,
                                STALE_AFTER_S - RETRY_PERIOD_S - INTERVAL_S)
        stale = self.stale("long")
        self.assertEqual(stale["reason"], "OperatorNotRunning")
        self.assertIn("no spawnpoint operator is running: its Lease %s/%s has not been renewed"
                      % (NS, RELEASE), stale["message"])
        self.assertIn("This status (phase Running) is what the operator last wrote",
                      stale["message"])
        self.assertEqual(self.job("long")["status"]["phase"], "Running")  # kept as written
        self.assertEqual(len(self.events("long", "StatusStale")), 1)
        self.assertEqual(self.events("long", "StatusStale")[0]["type"], "Warning")
        self.assertEqual(self.stale("short"), {})  # finished: its status stays true
        # The STALE column (empty columns in between: read it where its header starts).
        table = self.kubectl_ok("get", "tj", "long", "-n", TEAM).splitlines()
        column = re.search(r"\bSTALE\b", table[0])
        self.assertIsNotNone(column, table)
        self.assertEqual(table[1][column.start():].split()[0], "True", table)

        self.start_operator("operator-2")
        self.wait("StatusStale False", lambda: self.stale("long").get("status") == "False")
        self.assertEqual(self.stale("long")["reason"], "OperatorRunning")
        self.assertEqual(len(self.events("long", "StatusCurrent")), 1)
        open(release, "w").close()
        self.wait("long Succeeded", lambda: self.job("long").get("status", {}).get(
            "phase") == "Succeeded")
        self.assertEqual(self.stale("long")["status"], "False")
        self.assertEqual(self.watchdog_denials(), [])
        self.assertIsNone(self.watchdog.poll(), "the watchdog exited")


if __name__ == "__main__":
    cluster_fixture.main(build_dir=True, required=("--helm",))
