// Issue 16's acceptance through the operator, on the real control plane whose local nodes run
// each pod's trainer container as a local process (fixture operator_e2e_cluster): a 2-node
// job whose rank 1 prints `RuntimeError: CUDA error: out of memory` and exits 3. `kubectl
// describe tj` must show the cause, the quoted line and the rank's last lines in
// status.lastFailure, and the NodeFailed event must quote the line, not just "exited 3".
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/operator/harness.h"

namespace spawnpoint::op::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

TEST(OperatorFailureEndToEnd, DescribeShowsTheCauseTheLineAndTheTail) {
  OperatorHarness h(E2E_CLUSTER_KUBECONFIG);
  ASSERT_TRUE(h.ok()) << h.error();
  h.StartOperator({"--agent-path", AGENT_BIN, "--master-addr", "127.0.0.1"});
  const std::string script =
      "if [ \\\"$RANK\\\" = 1 ]; then echo 'epoch 1 loss 0.52'; echo 'epoch 2 starting' >&2; "
      "echo 'Traceback (most recent call last):' >&2; "
      "echo '  File \\\"train.py\\\", line 40, in <module>' >&2; "
      "echo 'RuntimeError: CUDA error: out of memory' >&2; exit 3; fi; exec sleep 60";
  const std::string manifest = R"(apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: oom
spec:
  nodes: 2
  gpusPerNode: 0
  procsPerNode: 1
  loader: {workersPerRank: 0}
  template:
    spec:
      containers:
        - name: trainer
          image: spawnpoint/example-trainer:latest
          command: [/bin/sh]
          args: ["-c", ")" + script +
                               R"("]
  restartPolicy:
    maxRestarts: 2
    retryOn: [Killed, OOMKilled, CollectiveTimeout]
  rendezvous:
    port: )" + std::to_string(FreePort()) +
                               R"(
  shmSize: 64Mi
)";
  const std::string path = h.dir() + "/oom.yaml";
  spawnpoint::testing::WriteFile(path, manifest);
  KubectlResult apply = h.Kubectl({"apply", "-f", path});
  ASSERT_EQ(apply.code, 0) << apply.err;

  // GpuOutOfMemory is not in retryOn: the job fails at once, without a restart.
  ASSERT_TRUE(h.WaitFor([&] { return h.Phase("oom") == "Failed"; }, seconds(90)))
      << h.Job("oom").dump(2) << h.Log();
  const json status = h.Job("oom")["status"];
  EXPECT_EQ(status.value("restarts", -1), 0) << status.dump(2);
  const json& last = status["lastFailure"];
  EXPECT_EQ(last["rank"], 1) << last.dump(2);
  EXPECT_EQ(last["node"], 1);
  EXPECT_EQ(last["exitCode"], 3);
  EXPECT_EQ(last["reason"], "GpuOutOfMemory");
  EXPECT_EQ(last["line"], "RuntimeError: CUDA error: out of memory");
  EXPECT_EQ(last["exception"], "RuntimeError");
  EXPECT_EQ(last["logStream"], "stderr");
  EXPECT_EQ(last["logTail"],
            "epoch 2 starting\nTraceback (most recent call last):\n  File \"train.py\", line 40, "
            "in <module>\nRuntimeError: CUDA error: out of memory");
  EXPECT_FALSE(last["retryable"].get<bool>());
  // retryOn came through the CRD's schema as written.
  EXPECT_EQ(h.Job("oom")["spec"]["restartPolicy"]["retryOn"],
            json::parse(R"(["Killed", "OOMKilled", "CollectiveTimeout"])"));

  KubectlResult describe = h.Kubectl({"describe", "tj", "oom"});
  ASSERT_EQ(describe.code, 0) << describe.err;
  EXPECT_THAT(describe.out, HasSubstr("GpuOutOfMemory"));
  EXPECT_THAT(describe.out, HasSubstr("RuntimeError: CUDA error: out of memory"));
  EXPECT_THAT(describe.out, HasSubstr("Log Tail:"));
  EXPECT_THAT(describe.out, HasSubstr("epoch 2 starting"));
  EXPECT_THAT(describe.out, HasSubstr("NodeFailed"));

  // The event and the Failed condition: one line that quotes the rank's words.
  KubectlResult events =
      h.Kubectl({"get", "events", "--field-selector", "involvedObject.name=oom,reason=NodeFailed",
                 "-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}"});
  ASSERT_EQ(events.code, 0) << events.err;
  EXPECT_THAT(events.out, HasSubstr("node 1 (pod oom-node-1) rank 1 exited 3 (GpuOutOfMemory): "
                                    "GPU out of memory: \"RuntimeError: CUDA error: out of "
                                    "memory\""))
      << events.out;
  std::string failed_message;
  for (const auto& c : status.value("conditions", json::array())) {
    if (c.value("type", "") == "Failed") failed_message = c.value("message", "");
  }
  EXPECT_THAT(failed_message, HasSubstr("\"RuntimeError: CUDA error: out of memory\""));
  EXPECT_EQ(failed_message.find('\n'), std::string::npos) << failed_message;
  h.Kubectl({"delete", "tj", "oom", "--wait=false"});
}

}  // namespace
}  // namespace spawnpoint::op::testing
