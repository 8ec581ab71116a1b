"""Another tenant cannot read a job's log lines from its agent (issue 41), on the real control
plane: the real spawnpoint-operator (with a status-token key file, as the chart gives it) and
agent, local_node.py's node running the pod as a process on this machine's non-loopback
address (so a reader of its agent comes from the network, as another pod's would).

Team-a's job has a rank that hangs (stallPolicy Report). The operator made the job's Secret
(its status token) before the pod; team-b's user may not read that Secret, team-a's may. A
reader without the token (another tenant's pod) gets the agent's /status without the stall's
message or stack and with a note saying so, as does one with a guessed token; the token from
the Secret reads all of it. The operator, which derives each job's token, reads all of it too:
the job's Stalled condition carries the agent's own message (the redacted document has none,
and the operator would fall back to "rank 1 (pod ...) made no step").

    python3 test_status_access_on_real_server.py --source-dir REPO --build-dir BUILD
"""

import base64
import json
import os
import urllib.request

import cluster_fixture
from cluster_fixture import wait_until

NS = "team-a"
OTHER = "team-b"


def args():
    return cluster_fixture.ARGS


def read_status(ip, port, token=None):
    """GET http://ip:port/status, parsed, with `token` as a bearer token when given."""
    request = urllib.request.Request("http://%s:%d/status" % (ip, port))
    if token is not None:
        request.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


class StatusAccessOnRealServerTest(cluster_fixture.OperatorClusterTest):
    NODES = 1
    NAMESPACE = NS
    UTILISATION_INTERVAL = "500ms"

    @classmethod
    def setUpCluster(cls):
        key = os.path.join(cls.tmp, "status-token-key")
        with open(key, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        cls.OPERATOR_ARGS = ("--status-token-key-file", key)
        cls.kubectl_ok("create", "namespace", OTHER)
        for ns, user in ((NS, "alice"), (OTHER, "bob")):
            cls.kubectl_ok("create", "rolebinding", user + "-edit", "--clusterrole=edit",
                           "--user=" + user, "-n", ns)

    def test_only_the_token_reads_the_log_lines(self):
        trainer = os.path.join(args().build_dir, "bin", "spawnpoint-example-trainer")
        self.apply(cluster_fixture.training_job(
            "hang", NS, [trainer, "--epochs", "1", "--steps-per-epoch", "400", "--hang-at-step",
                         "5", "--fail-rank", "1", "--data", "memory"], nodes=1, procs=2,
            template_metadata={"annotations": {"local-node.spawnpoint.dev/own-pod-ip": "host"}},
            stallPolicy={"timeoutSeconds": 5, "action": "Report"}))

        def condition():
            for c in (self.get("tj", "-n", NS, "hang").get("status") or {}).get("conditions", []):
                if c["type"] == "Stalled" and c["status"] == "True":
                    return c
            return None
        if not wait_until(condition, 180):
            self.fail("never stalled: %s\n%s" % (self.get("tj", "-n", NS, "hang").get("status"),
                                                 self.cluster.log("operator")[-3000:]))
        stalled = condition()
        # The agent's own message, which only the token's holder reads: the operator's.
        self.assertRegex(stalled["message"], r"^rank 1 \(pod [^)]+\) made no step for ",
                         json.dumps(stalled))
        self.assertIn("topFrame", self.get("tj", "-n", NS, "hang")["status"]["stall"])

        pod = self.get("pod", "-n", NS, "hang-node-0")
        ip = pod["status"]["podIP"]
        self.assertFalse(ip.startswith("127."), "the pod must be reached from the network: " + ip)
        port = self.cluster.agent_status_port
        volumes = [v for v in pod["spec"]["volumes"] if "secret" in v]
        self.assertEqual(len(volumes), 1, json.dumps(pod["spec"]["volumes"]))
        secret = volumes[0]["secret"]["secretName"]
        self.assertIn("--status-token-file", pod["spec"]["containers"][0]["command"])
        env = json.dumps(pod["spec"]["containers"][0].get("env", []))
        self.assertNotIn("status-token", env, "the token is never in the ranks' environment")

        # Who may read the Secret: team-a's user, not team-b's.
        for user, want in (("alice", "yes"), ("bob", "no")):
            code, out = self.cluster.kubectl("auth", "can-i", "get", "secret/" + secret, "-n", NS,
                                             "--as", user)
            self.assertEqual(out.strip().splitlines()[-1], want, "%s: %s" % (user, out))
        token = base64.b64decode(self.get("secret", "-n", NS, secret)["data"]["status"]).decode()

        # Another tenant's pod, and one that guessed: no stack, message or top frame.
        for guess in (None, "0" * 64, token[:-1]):
            doc = read_status(ip, port, guess)
            self.assertEqual(doc["stall"]["rank"], 1, json.dumps(doc["stall"]))
            for key in ("message", "topFrame", "stackSource"):
                self.assertNotIn(key, doc["stall"], "token %r: %s" % (guess, doc["stall"]))
            self.assertIn("status token", doc.get("redacted", ""))
        # The Secret's token reads it all.
        doc = read_status(ip, port, token)
        self.assertNotIn("redacted", doc)
        self.assertRegex(doc["stall"]["message"], r"made no step for ")
        self.assertIn("topFrame", doc["stall"])


if __name__ == "__main__":
    cluster_fixture.main(build_dir=True)
