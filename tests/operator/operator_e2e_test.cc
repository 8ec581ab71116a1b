// End to end on a real control plane (fixture operator_e2e_cluster) whose local nodes run
// each pod's trainer container as a local process: the operator creates the pods with the
// agent used in place and rendezvous on 127.0.0.1, and
// examples/local-cluster.yaml (2 nodes x 1 CPU rank of the example DDP trainer) is applied
// with kubectl: the ranks rendezvous, train, the job reaches Succeeded and both ranks end
// with the same parameters. A job whose rank hangs shows the Stalled condition and the
// RankStalled event with kubectl, and one whose rank on the other node does twice its peer's
// work per step the Straggler condition and event, with a ratio in the band of 2 (issue 13).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>

#include "tests/operator/harness.h"
#include "tests/support/straggler_band.h"

namespace spawnpoint::op::testing {
namespace {

using std::chrono::seconds;

// A container's log as the local node keeps it (<cluster dir>/node/pods/<ns>_<pod>_<uid>/
// <container>.log): there is no kubelet endpoint for `kubectl logs`.
std::string PodLog(const OperatorHarness& h, const std::string& pod,
                   const std::string& container = "trainer") {
  const std::filesystem::path pods =
      std::filesystem::path(E2E_CLUSTER_KUBECONFIG).parent_path() / "node" / "pods";
  const std::string prefix = h.ns() + "_" + pod + "_";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(pods, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) {
      return spawnpoint::testing::ReadFile((entry.path() / (container + ".log")).string());
    }
  }
  return "";
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(OperatorEndToEnd, LocalClusterExampleTrainsToSuccess) {
  OperatorHarness h(E2E_CLUSTER_KUBECONFIG);
  ASSERT_TRUE(h.ok()) << h.error();
  h.StartOperator({"--agent-path", AGENT_BIN, "--master-addr", "127.0.0.1"});

  // The example as a user applies it, with the trainer's absolute path (the test does not
  // run from the repository root) and a free rendezvous port.
  std::string manifest = spawnpoint::testing::ReadFile(SOURCE_DIR "/examples/local-cluster.yaml");
  ASSERT_NE(manifest.find("build/bin/spawnpoint-example-trainer"), std::string::npos);
  manifest = Replace(manifest, "build/bin/spawnpoint-example-trainer", TRAINER_BIN);
  manifest = Replace(manifest, "port: 29531", "port: " + std::to_string(FreePort()));
  const std::string path = h.dir() + "/local-cluster.yaml";
  spawnpoint::testing::WriteFile(path, manifest);
  KubectlResult apply = h.Kubectl({"apply", "-f", path});
  ASSERT_EQ(apply.code, 0) << apply.err;

  ASSERT_TRUE(h.WaitFor(
      [&] {
        std::string phase = h.Phase("local-cluster");
        return phase == "Succeeded" || phase == "Failed";
      },
      seconds(90)))
      << h.Job("local-cluster").dump(2) << h.Log();
  ASSERT_EQ(h.Phase("local-cluster"), "Succeeded")
      << h.Job("local-cluster").dump(2) << PodLog(h, "local-cluster-node-0")
      << PodLog(h, "local-cluster-node-1");

  // Each pod's log (the agent's output) ends with its rank's final line.
  static const std::regex final_line("\\[rank ([01])\\] final rank=[01] .*params=([0-9a-f]+)");
  std::map<std::string, std::string> params;
  for (int node = 0; node < 2; ++node) {
    const std::string log = PodLog(h, "local-cluster-node-" + std::to_string(node));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, final_line)) << log;
    params[m[1]] = m[2];
  }
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params["0"], params["1"]) << "both ranks hold the same parameters after DDP";
  KubectlResult get = h.Kubectl({"get", "tj", "local-cluster"});
  EXPECT_THAT(get.out, ::testing::HasSubstr("Succeeded"));
}

// The utilisation path with the real agent: the operator tells the agent which port to
// serve (--agent-status-port), reads its /status while the job runs and writes the
// loader's figures into status.utilisation. One node: every pod of the local nodes shares
// 127.0.0.1, where only one agent can hold the port.
TEST(OperatorEndToEnd, UtilisationComesFromTheRealAgent) {
  OperatorHarness h(E2E_CLUSTER_KUBECONFIG);
  ASSERT_TRUE(h.ok()) << h.error();
  const int port = FreePort();
  h.StartOperator({"--agent-path", AGENT_BIN, "--master-addr", "127.0.0.1", "--agent-status-port",
                   std::to_string(port), "--utilisation-interval", "300ms"});
  std::string manifest = spawnpoint::testing::ReadFile(SOURCE_DIR "/examples/local-cluster.yaml");
  manifest = Replace(manifest, "build/bin/spawnpoint-example-trainer", TRAINER_BIN);
  manifest = Replace(manifest, "port: 29531", "port: " + std::to_string(FreePort()));
  manifest = Replace(manifest, "nodes: 2", "nodes: 1");
  manifest = Replace(manifest, "name: local-cluster", "name: real-util");
  // Long enough to be read a few times; the job is deleted once it has been.
  manifest = Replace(manifest, "--epochs, \"3\"", "--epochs, \"1000\"");
  const std::string path = h.dir() + "/real-util.yaml";
  spawnpoint::testing::WriteFile(path, manifest);
  KubectlResult apply = h.Kubectl({"apply", "-f", path});
  ASSERT_EQ(apply.code, 0) << apply.err;

  ASSERT_TRUE(h.WaitFor(
      [&] {
        const json job = h.Job("real-util");
        if (!job.is_object() || !job.contains("status")) return false;
        const json u = job["status"].value("utilisation", json::object());
        return u.value("pods", 0) == 1 && u.contains("samplesPerSecond") &&
               u["samplesPerSecond"].is_number() && u["samplesPerSecond"].get<double>() > 0;
      },
      seconds(60)))
      << h.Job("real-util").dump(2) << h.Log() << PodLog(h, "real-util-node-0");
  const json u = h.Job("real-util")["status"]["utilisation"];
  EXPECT_FALSE(u.contains("error")) << u.dump();
  ASSERT_TRUE(u["dataStall"].is_number()) << u.dump();
  EXPECT_GE(u["dataStall"].get<double>(), 0.0);
  EXPECT_LE(u["dataStall"].get<double>(), 1.0);
  EXPECT_TRUE(!u.contains("gpu") || u["gpu"].is_null())
      << "a CPU job reports no GPU utilisation, not 0: " << u.dump();
  h.Kubectl({"delete", "tj", "real-util", "--wait=false"});
}

// The GPU figures: the pod runs a stand-in that serves an agent status document with a GPU
// reading on the status port (no GPU here to make the real agent report one).
TEST(OperatorEndToEnd, UtilisationIsReadFromThePodsStatusEndpoint) {
  OperatorHarness h(E2E_CLUSTER_KUBECONFIG);
  ASSERT_TRUE(h.ok()) << h.error();
  const int port = FreePort();
  const std::string site = h.dir() + "/site";
  ASSERT_EQ(system(("mkdir -p " + site).c_str()), 0);
  spawnpoint::testing::WriteFile(
      site + "/status",
      R"({"job":"util","nodeRank":0,"phase":"Running","gpus":[{"utilisation":0.93}],)"
      R"("loader":[{"rank":0,"stats":{"dataStall":0.04,"samplesPerSecond":1234.5}}]})");
  const std::string agent = h.dir() + "/fake-agent.sh";
  spawnpoint::testing::WriteFile(agent, "#!/bin/sh\nexec python3 -m http.server " +
                                            std::to_string(port) +
                                            " --bind 127.0.0.1 --directory " + site + "\n");
  ASSERT_EQ(chmod(agent.c_str(), 0755), 0);
  h.StartOperator({"--agent-path", agent, "--agent-status-port", std::to_string(port),
                   "--utilisation-interval", "500ms"});
  json job = TestJob("util", 1);
  ASSERT_TRUE(h.Apply(job));
  ASSERT_TRUE(
      h.WaitFor([&] { return JsonField(h.Job("util"), "/status/utilisation/dataStall") == "0.04"; },
                seconds(20)))
      << h.Job("util").dump(2) << h.Log();
  const json u = h.Job("util")["status"]["utilisation"];
  EXPECT_EQ(u["gpu"], 0.93);
  EXPECT_EQ(u["samplesPerSecond"], 1234.5);
  EXPECT_EQ(u["pods"], 1);
  KubectlResult get = h.Kubectl({"get", "tj", "util"});
  EXPECT_THAT(get.out, ::testing::HasSubstr("0.93"));
  EXPECT_THAT(get.out, ::testing::HasSubstr("0.04"));
  h.Kubectl({"delete", "tj", "util", "--wait=false"});
}

// Issue 13's acceptance through kubectl: 2 CPU ranks of the example trainer on one node, rank
// 1 hangs at step 5 (HangForever) while rank 0 waits for it in the allreduce. With
// stallPolicy {timeoutSeconds: 5, action: Report} the agent names rank 1 in its /status
// "stall"; the operator reads it and the job shows the Stalled condition (the STALLED column
// of `kubectl get tj`, `kubectl describe tj`) and a RankStalled event naming rank 1, while
// the job keeps running (Report stops nothing).
TEST(OperatorEndToEnd, AHungRankIsShownStalledWithKubectl) {
  OperatorHarness h(E2E_CLUSTER_KUBECONFIG);
  ASSERT_TRUE(h.ok()) << h.error();
  const int port = FreePort();
  h.StartOperator({"--agent-path", AGENT_BIN, "--master-addr", "127.0.0.1", "--agent-status-port",
                   std::to_string(port), "--utilisation-interval", "500ms"});
  const std::string manifest = std::string(R"(apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: hang
spec:
  nodes: 1
  gpusPerNode: 0
  procsPerNode: 2
  backend: gloo
  template:
    spec:
      containers:
        - name: trainer
          image: spawnpoint/example-trainer:latest
          command: [)") + TRAINER_BIN +
                               R"(]
          args: [--epochs, "1", --steps-per-epoch, "400", --hang-at-step, "5", --fail-rank, "1",
                 --data, memory]
  stallPolicy:
    timeoutSeconds: 5
    action: Report
  restartPolicy:
    maxRestarts: 0
  rendezvous:
    port: )" + std::to_string(FreePort()) +
                               R"(
  shmSize: 256Mi
)";
  const std::string path = h.dir() + "/hang.yaml";
  spawnpoint::testing::WriteFile(path, manifest);
  KubectlResult apply = h.Kubectl({"apply", "-f", path});
  ASSERT_EQ(apply.code, 0) << apply.err;

  auto stalled = [&] {
    const json job = h.Job("hang");
    if (!job.is_object() || !job.contains("status")) return json::object();
    for (const auto& c : job["status"].value("conditions", json::array())) {
      if (c.value("type", "") == "Stalled") return c;
    }
    return json::object();
  };
  // The stall is named 5 s (the timeout) after rank 1's last step; then read within 500 ms.
  ASSERT_TRUE(h.WaitFor([&] { return stalled().value("status", "") == "True"; }, seconds(90)))
      << h.Job("hang").dump(2) << h.Log() << PodLog(h, "hang-node-0");
  const json condition = stalled();
  EXPECT_EQ(condition["reason"], "RankStalled");
  // The agent's message names the pod by its host's name (here the machine's, not the pod's).
  EXPECT_THAT(condition["message"].get<std::string>(),
              ::testing::ContainsRegex("^rank 1 \\((pod|node) [^)]+\\) made no step for"));
  const json status = h.Job("hang")["status"];
  EXPECT_EQ(status["phase"], "Running") << "Report keeps the job running";
  EXPECT_EQ(status["stall"]["rank"], 1) << status.dump(2);
  EXPECT_EQ(status["stall"]["pod"], "hang-node-0") << status.dump(2);

  // kubectl get tj: the STALLED column says True (cells may be empty: read by position).
  KubectlResult get = h.Kubectl({"get", "tj", "hang"});
  ASSERT_EQ(get.code, 0) << get.err;
  std::istringstream lines(get.out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  const size_t at = header.find("STALLED");
  ASSERT_NE(at, std::string::npos) << get.out;
  ASSERT_GT(row.size(), at) << get.out;
  EXPECT_EQ(row.substr(at, row.find(' ', at) - at), "True") << get.out;

  // kubectl describe tj: the condition and the event.
  KubectlResult describe = h.Kubectl({"describe", "tj", "hang"});
  ASSERT_EQ(describe.code, 0) << describe.err;
  EXPECT_THAT(describe.out, ::testing::HasSubstr("RankStalled"));
  EXPECT_THAT(describe.out, ::testing::HasSubstr("rank 1 (pod "));

  // kubectl get events: one RankStalled Warning naming rank 1.
  KubectlResult events =
      h.Kubectl({"get", "events", "--field-selector", "involvedObject.name=hang,reason=RankStalled",
                 "-o", "jsonpath={range .items[*]}{.type} {.count} {.message}{\"\\n\"}{end}"});
  ASSERT_EQ(events.code, 0) << events.err;
  EXPECT_THAT(events.out,
              ::testing::ContainsRegex("^Warning 1 rank 1 \\((pod|node) [^)]+\\) made no step"))
      << events.out;
  EXPECT_EQ(std::count(events.out.begin(), events.out.end(), '\n'), 1) << events.out;
  h.Kubectl({"delete", "tj", "hang", "--wait=false"});
}

// Issue 13's straggler acceptance across two nodes, through the operator: 2 nodes x 1 Python
// rank (gloo) of tests/python/stall_scripts/straggler_ddp.py, rank 1 doing twice rank 0's work
// per step (the same unit of work counted twice). No agent can tell (each has one rank); the
// operator compares the two agents' figures (progress[].busySeconds in /status) and names
// rank 1 of pod straggler-node-1 with a ratio in the band of the counted 2 units to 1
// (tests/support/straggler_band.h): the Stalled condition with reason Straggler (`kubectl get
// tj -o json`, the STALLED column, `kubectl describe tj`) and a Straggler event.
//
// The local nodes run every pod on the host's network, where two agents cannot both serve the
// status port on every interface: the pods get addresses of their own
// (local-node.spawnpoint.dev/own-pod-ip, tests/cluster/local_node.py) and the agent is started
// through a wrapper that serves on the pod's address.
TEST(OperatorEndToEnd, AStragglerOnAnotherNodeIsNamedWithKubectl) {
  OperatorHarness h(E2E_CLUSTER_KUBECONFIG);
  ASSERT_TRUE(h.ok()) << h.error();
  const std::string agent = h.dir() + "/agent-on-pod-ip.sh";
  spawnpoint::testing::WriteFile(agent, std::string(R"(#!/bin/sh
: "${POD_IP:?the pod's own address}"
prev=
for a in "$@"; do
  shift
  if [ "$prev" = --metrics-addr ]; then a="$POD_IP$a"; fi
  set -- "$@" "$a"
  prev=$a
done
exec )") + AGENT_BIN + " \"$@\"\n");
  ASSERT_EQ(chmod(agent.c_str(), 0755), 0);
  const int port = FreePort();
  h.StartOperator({"--agent-path", agent, "--master-addr", "127.0.0.1", "--agent-status-port",
                   std::to_string(port), "--utilisation-interval", "500ms"});
  // One unit of 60 ms of work and a pass per step, two for rank 1; long enough to outlast the
  // checks (the job is deleted at the end).
  const std::string manifest = std::string(R"(apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: straggler
spec:
  nodes: 2
  gpusPerNode: 0
  procsPerNode: 1
  backend: gloo
  template:
    metadata:
      annotations:
        local-node.spawnpoint.dev/own-pod-ip: "true"
    spec:
      containers:
        - name: trainer
          image: spawnpoint/example-trainer:latest
          command: [/usr/bin/python3, ")") +
                               SOURCE_DIR R"(/tests/python/stall_scripts/straggler_ddp.py"]
          args: ["3000", "60", "1", "2"]
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
  restartPolicy:
    maxRestarts: 0
  rendezvous:
    port: )" + std::to_string(FreePort()) +
                               R"(
  shmSize: 256Mi
)";
  const std::string path = h.dir() + "/straggler.yaml";
  spawnpoint::testing::WriteFile(path, manifest);
  KubectlResult apply = h.Kubectl({"apply", "-f", path});
  ASSERT_EQ(apply.code, 0) << apply.err;

  // kubectl get tj -o json: the job's conditions of `type`.
  auto condition_of = [&](const std::string& type) {
    KubectlResult get = h.Kubectl({"get", "tj", "straggler", "-o", "json"});
    const json job = json::parse(get.out, nullptr, /*allow_exceptions=*/false);
    if (get.code != 0 || !job.is_object() || !job.contains("status")) return json::object();
    for (const auto& c : job["status"].value("conditions", json::array())) {
      if (c.value("type", "") == type) return c;
    }
    return json::object();
  };
  // Both ranks need 20 steps (a few seconds); then one reading, every 500 ms.
  ASSERT_TRUE(h.WaitFor([&] { return condition_of("Straggler").value("status", "") == "True"; },
                        seconds(120)))
      << h.Job("straggler").dump(2) << h.Log() << PodLog(h, "straggler-node-0")
      << PodLog(h, "straggler-node-1");
  const json condition = condition_of("Straggler");
  EXPECT_EQ(condition["reason"], "SlowerThanPeers") << condition.dump();
  // A slow rank is not a hang: Stalled is never True for it.
  EXPECT_NE(condition_of("Stalled").value("status", ""), "True") << h.Job("straggler").dump(2);
  const std::string message = condition.value("message", "");
  std::smatch m;
  static const std::regex named(
      "^rank 1 \\(pod straggler-node-1\\) is ([0-9.]+)x slower than the other ranks: ");
  ASSERT_TRUE(std::regex_search(message, m, named)) << message;
  // Rank 1 does the same unit of work (sleep and compute) twice per step, rank 0 once: load
  // stretches both ranks' units alike, so the measured ratio stays in the band of the count,
  // in the condition and in the status, and a ratio mis-scaled by 3 falls outside it.
  constexpr double kUnits = 2;
  const double ratio = std::stod(m[1]);
  EXPECT_GE(ratio, spawnpoint::testing::StragglerBandLow(kUnits)) << message;
  EXPECT_LE(ratio, spawnpoint::testing::StragglerBandHigh(kUnits)) << message;
  std::printf("straggler named across two nodes: %s\n", message.c_str());
  const json status = h.Job("straggler")["status"];
  EXPECT_EQ(status["phase"], "Running") << status.dump(2);
  EXPECT_EQ(status["straggler"]["rank"], 1) << status.dump(2);
  EXPECT_EQ(status["straggler"]["pod"], "straggler-node-1") << status.dump(2);
  ASSERT_TRUE(status["straggler"]["ratio"].is_number()) << status.dump(2);
  EXPECT_GE(status["straggler"]["ratio"].get<double>(),
            spawnpoint::testing::StragglerBandLow(kUnits))
      << status.dump(2);
  EXPECT_LE(status["straggler"]["ratio"].get<double>(),
            spawnpoint::testing::StragglerBandHigh(kUnits))
      << status.dump(2);
  EXPECT_FALSE(status.contains("stall")) << "nothing is stalled: " << status.dump(2);
  EXPECT_EQ(status["utilisation"].value("pods", 0), 2) << "both agents were read";

  // kubectl get tj -o wide: STRAGGLER says True, STALLED does not.
  KubectlResult get = h.Kubectl({"get", "tj", "straggler", "-o", "wide"});
  ASSERT_EQ(get.code, 0) << get.err;
  std::istringstream lines(get.out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  auto cell = [&](const std::string& column) {
    const size_t at = header.find(column);
    if (at == std::string::npos || row.size() <= at) return std::string("(none)");
    return row.substr(at, row.find(' ', at) - at);
  };
  EXPECT_EQ(cell("STRAGGLER"), "True") << get.out;
  EXPECT_NE(cell("STALLED "), "True") << get.out;

  // kubectl describe tj: the condition and the event.
  KubectlResult describe = h.Kubectl({"describe", "tj", "straggler"});
  ASSERT_EQ(describe.code, 0) << describe.err;
  EXPECT_THAT(describe.out, ::testing::HasSubstr("Straggler"));
  EXPECT_THAT(describe.out, ::testing::HasSubstr("rank 1 (pod straggler-node-1) is "));

  // kubectl get events: Straggler Warnings, each naming rank 1 (events reach the API a little
  // after the status write).
  auto events = [&] {
    return h.Kubectl({"get", "events", "--field-selector",
                      "involvedObject.name=straggler,reason=Straggler", "-o",
                      "jsonpath={range .items[*]}{.type} {.message}{\"\\n\"}{end}"});
  };
  ASSERT_TRUE(h.WaitFor([&] { return !events().out.empty(); }, seconds(30)))
      << events().err << h.Log();
  const std::string listed = events().out;
  std::istringstream event_lines(listed);
  int n = 0;
  for (std::string line; std::getline(event_lines, line); ++n) {
    EXPECT_THAT(line, ::testing::StartsWith("Warning rank 1 (pod straggler-node-1) is ")) << listed;
  }
  EXPECT_GE(n, 1) << listed;
  h.Kubectl({"delete", "tj", "straggler", "--wait=false"});
}

}  // namespace
}  // namespace spawnpoint::op::testing
