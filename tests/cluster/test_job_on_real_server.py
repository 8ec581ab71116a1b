"""A TrainingJob end to end on the real control plane (issue 23): scripts/cluster.sh's
kube-apiserver, etcd, controller-manager and scheduler, local_node.py's two nodes running the
pods as local processes, the real spawnpoint-operator and the real agent. The example DDP job
(examples/local-cluster.yaml: 2 nodes, 1 CPU rank each) must reach Succeeded, its pods
scheduled one per node, both ranks ending with the same parameters; deleting the job must
take its pods and Service with it (the controller-manager's garbage collector, through the
owner references the operator sets). A valueFrom env entry (fieldRef, secretKeyRef) reaches
the rank.

    python3 test_job_on_real_server.py --source-dir REPO --build-dir BUILD [unittest args]
"""

import glob
import json
import os
import re
import unittest

import cluster_fixture


def args():
    """The command line (cluster_fixture.main)."""
    return cluster_fixture.ARGS


DEADLINE_S = 300  # two ranks start, rendezvous and train 3 short epochs on a loaded machine


class JobOnRealServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster_fixture.Cluster(args().source_dir, args().tools_bin, nodes=2)
        cls.node_dir = cls.cluster.node_dir
        cls.cluster.start_operator(args().build_dir)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def kubectl_json(self, *args):
        code, out = self.cluster.kubectl(*(list(args) + ["-o", "json"]))
        self.assertEqual(code, 0, out)
        return json.loads(out)

    def wait(self, what, condition, deadline_s=DEADLINE_S):
        if cluster_fixture.wait_until(condition, deadline_s):
            return
        self.fail("%s not within %d s\noperator:\n%s" % (
            what, deadline_s, self.cluster.log("operator")[-3000:]))

    def test_example_job_succeeds_with_equal_parameters_and_is_collected(self):
        with open(os.path.join(args().source_dir, "examples", "local-cluster.yaml")) as f:
            manifest = f.read().replace("build/bin/", os.path.join(args().build_dir, "bin") + "/")
        # Its own rendezvous port: the cluster tests run side by side on one loopback.
        manifest = re.sub(r"port: \d+", "port: %d" % cluster_fixture.free_port(), manifest, 1)
        code, out = self.cluster.kubectl("apply", "-f", "-", stdin=manifest)
        self.assertEqual(code, 0, out)

        def phase():
            return self.kubectl_json("get", "tj", "local-cluster").get("status", {}).get("phase")
        self.wait("phase Succeeded", lambda: phase() in ("Succeeded", "Failed"))
        job = self.kubectl_json("get", "tj", "local-cluster")
        self.assertEqual(job["status"]["phase"], "Succeeded", json.dumps(job["status"]))
        self.assertEqual(job["status"]["nodes"].get("succeeded"), 2, job["status"])
        pods = self.kubectl_json("get", "pods", "-l",
                                 "spawnpoint.dev/job-name=local-cluster")["items"]
        self.assertEqual(sorted(p["spec"]["nodeName"] for p in pods),
                         ["local-node-0", "local-node-1"], "one pod per node")
        for p in pods:
            state = p["status"]["containerStatuses"][0]["state"]
            self.assertEqual(state.get("terminated", {}).get("exitCode"), 0, state)
        params = set()
        for path in glob.glob(os.path.join(self.node_dir, "pods", "default_local-cluster-node-*",
                                           "trainer.log")):
            with open(path) as f:
                params.update(re.findall(r"final rank=\d+ loss=\S+ params=([0-9a-f]+)", f.read()))
        self.assertEqual(len(params), 1, "both ranks' final parameters: %s" % sorted(params))

        code, out = self.cluster.kubectl("delete", "tj", "local-cluster", "--wait=true",
                                         "--timeout=120s")
        self.assertEqual(code, 0, out)

        def collected():
            names = [p["metadata"]["name"] for p in self.kubectl_json("get", "pods")["items"]]
            services = [s["metadata"]["name"]
                        for s in self.kubectl_json("get", "services")["items"]]
            return not [n for n in names if n.startswith("local-cluster-")] and \
                "local-cluster" not in services
        self.wait("the job's pods and Service garbage collected", collected, 120)

    def test_value_from_env_reaches_the_rank(self):
        # The kubelet (here local_node.py) resolves valueFrom into the pod's environment; the
        # operator keeps the entries in the pod and the agent passes that environment to
        # each rank. The rank's exit code is the check: Succeeded only if it saw the values.
        code, out = self.cluster.kubectl("create", "secret", "generic", "wandb",
                                         "--from-literal=token=s3cret")
        self.assertEqual(code, 0, out)
        manifest = VALUE_FROM_JOB % cluster_fixture.free_port()
        code, out = self.cluster.kubectl("apply", "-f", "-", stdin=manifest)
        self.assertEqual(code, 0, out)

        def phase():
            return self.kubectl_json("get", "tj", "value-from").get("status", {}).get("phase")
        self.wait("phase Succeeded", lambda: phase() in ("Succeeded", "Failed"))
        job = self.kubectl_json("get", "tj", "value-from")
        self.assertEqual(job["status"]["phase"], "Succeeded", json.dumps(job["status"]))
        pod = self.kubectl_json("get", "pod", "value-from-node-0")
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        self.assertEqual(env["TRAINER_POD"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.name")


# One node, one CPU rank that exits 0 only if both valueFrom variables reached it.
VALUE_FROM_JOB = """\
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: value-from}
spec:
  template:
    spec:
      containers:
        - name: trainer
          image: example.invalid/none  # local_node.py runs the command as it is
          command: [/bin/sh, -c,
                    'test "$TRAINER_POD" = value-from-node-0 && test "$WANDB_TOKEN" = s3cret']
          env:
            - name: TRAINER_POD
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            - name: WANDB_TOKEN
              valueFrom: {secretKeyRef: {name: wandb, key: token}}
  loader: {workersPerRank: 0}
  restartPolicy: {maxRestarts: 0}
  rendezvous: {port: %d}
  runPolicy: {cleanPodPolicy: None}
"""


if __name__ == "__main__":
    cluster_fixture.main(build_dir=True)
