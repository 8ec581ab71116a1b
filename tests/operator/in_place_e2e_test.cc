// Issue 19's operator acceptance end to end (fixture operator_e2e_cluster: the real control
// plane, the operator binary, kubectl, and local nodes that run each pod's trainer container
// as a local process): jobs of 2 nodes whose agents restart their gang in place
// (restartPolicy.mode InPlace, the default).
//  - A rank on node 1 SIGKILLed mid-training: the job Succeeds with equal parameters on both
//    ranks, status.restarts 1 and lastFailure naming node 1, rank 1, Killed, seen Restarting
//    with `kubectl get tj -w`, the Restarting and Restarted events; no pod replaced (same
//    UIDs) and the loader workers' pids unchanged on both nodes.
//  - `kubectl delete pod` of node 1, then of node 0 (the coordinator): only that pod is
//    recreated, under the same name, the other keeps its UID, and the job Succeeds.
//  - maxRestarts 2 and ranks that always fail: Failed with MaxRestartsReached after exactly 2
//    restarts, the pods kept; also when the coordinator's pod is deleted before the last
//    attempt has failed (in the backoff before it, or during it).
//  - restartPolicy.mode Recreate: the same death recreates both pods, as before.
// Every pod gets an address of its own (local-node.spawnpoint.dev/own-pod-ip) and its agent
// serves the status port there (a wrapper rewrites --metrics-addr), so the operator reads
// each agent; node 0's agent serves the gang on every interface, on a port of the test's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "tests/operator/harness.h"

namespace spawnpoint::op::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

// The logs of every incarnation of pod `pod` (<cluster dir>/node/pods/<ns>_<pod>_<uid>/
// trainer.log), oldest first by directory time.
std::string PodLogs(const OperatorHarness& h, const std::string& pod) {
  const std::filesystem::path pods =
      std::filesystem::path(E2E_CLUSTER_KUBECONFIG).parent_path() / "node" / "pods";
  const std::string prefix = h.ns() + "_" + pod + "_";
  std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> dirs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(pods, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) {
      dirs.emplace_back(std::filesystem::last_write_time(entry.path(), ec), entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  std::string out;
  for (const auto& [t, dir] : dirs) {
    out += spawnpoint::testing::ReadFile((dir / "trainer.log").string());
  }
  return out;
}

class InPlaceEndToEnd : public ::testing::Test {
 public:  // BudgetIsSpent drives it too
  void SetUp() override {
    ASSERT_TRUE(h_.ok()) << h_.error();
    const std::string agent = h_.dir() + "/agent-on-pod-ip.sh";
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
    h_.StartOperator({"--agent-path", agent, "--master-addr", "127.0.0.1", "--agent-status-port",
                      std::to_string(FreePort()), "--agent-gang-port", std::to_string(FreePort()),
                      "--gang-status-interval", "300ms"});
  }

  // A 2-node job of the example trainer (1 CPU rank per node, 2 loader workers each).
  void ApplyJob(const std::string& name, const std::string& command, const std::string& args,
                int max_restarts, int backoff_seconds, int workers = 2,
                const std::string& mode = "InPlace") {
    const std::string manifest =
        "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\n"
        "metadata:\n  name: " +
        name + R"(
spec:
  nodes: 2
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
          command: )" +
        command + R"(
          args: )" +
        args + R"(
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            # Python ranks' standbys import at normal priority: an idle-priority one might
            # not be ready in time beside other tests' processes.
            - name: SPAWNPOINT_STANDBY_PRIORITY
              value: normal
  loader:
    workersPerRank: )" +
        std::to_string(workers) +
        R"(
  restartPolicy:
    mode: )" +
        mode + R"(
    maxRestarts: )" +
        std::to_string(max_restarts) + "\n    backoffSeconds: " + std::to_string(backoff_seconds) +
        R"(
  rendezvous:
    port: )" +
        std::to_string(FreePort()) + R"(
  shmSize: 256Mi
  runPolicy:
    cleanPodPolicy: None
)";
    const std::string path = h_.dir() + "/" + name + ".yaml";
    spawnpoint::testing::WriteFile(path, manifest);
    KubectlResult apply = h_.Kubectl({"apply", "-f", path});
    ASSERT_EQ(apply.code, 0) << apply.err;
  }

  std::string Uid(const std::string& pod) { return JsonField(h_.Pod(pod), "/metadata/uid"); }
  bool PodRunning(const std::string& pod) {
    return JsonField(h_.Pod(pod), "/status/phase") == "Running";
  }
  // Waits for Succeeded or Failed; the phase.
  std::string WaitFinished(const std::string& job, std::chrono::seconds timeout = seconds(150)) {
    h_.WaitFor(
        [&] {
          const std::string p = h_.Phase(job);
          return p == "Succeeded" || p == "Failed";
        },
        timeout);
    return h_.Phase(job);
  }
  std::string Diagnose(const std::string& job) {
    return h_.Job(job).dump(2) + "\n--- operator\n" + h_.Log() + "\n--- node-0\n" +
           PodLogs(h_, job + "-node-0") + "\n--- node-1\n" + PodLogs(h_, job + "-node-1");
  }
  int CountEvents(const std::string& job, const std::string& reason) {
    int n = 0;
    for (const json& e : h_.Events(job)) n += e.value("reason", "") == reason;
    return n;
  }
  // `kubectl get tj <job> -w`: one line per change, "PHASE RESTARTS".
  std::unique_ptr<TestProcess> Watch(const std::string& job) {
    return std::make_unique<TestProcess>(std::vector<std::string>{
        KUBECTL_BIN, "--kubeconfig", h_.kubeconfig(), "-n", h_.ns(), "get", "tj", job, "-w", "-o",
        "jsonpath={.status.phase} {.status.restarts}{\"\\n\"}"});
  }

  OperatorHarness h_{E2E_CLUSTER_KUBECONFIG};
};

// The final parameters of each rank ("final rank=R ... params=HEX"), by rank.
std::map<std::string, std::string> FinalParams(const std::string& logs) {
  static const std::regex final_line("final rank=([01]) .*params=([0-9a-f]+)");
  std::map<std::string, std::string> params;
  for (auto it = std::sregex_iterator(logs.begin(), logs.end(), final_line);
       it != std::sregex_iterator(); ++it) {
    params[(*it)[1]] = (*it)[2];
  }
  return params;
}

// The loader workers' pids each attempt of `rank` printed ("loader rank=R epoch=0 restart=N
// worker_pids=a,b"), by restart.
std::map<int, std::string> WorkerPids(const std::string& out, int rank) {
  std::map<int, std::string> by_restart;
  std::regex line("loader rank=" + std::to_string(rank) +
                  R"( epoch=0 restart=([0-9]+) worker_pids=([0-9,]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    by_restart[std::stoi((*it)[1])] = (*it)[2];
  }
  return by_restart;
}

TEST_F(InPlaceEndToEnd, ARankKilledOnNode1RestartsTheGangInPlace) {
  ApplyJob("kill", "[\"" TRAINER_BIN "\"]",
           "[--epochs, '2', --steps-per-epoch, '40', --fail-at-step, '20', --fail-rank, '1', "
           "--fail-signal, '9']",
           /*max_restarts=*/3, /*backoff_seconds=*/10);
  auto watch = Watch("kill");
  ASSERT_TRUE(h_.WaitFor([&] { return PodRunning("kill-node-0") && PodRunning("kill-node-1"); },
                         seconds(60)))
      << Diagnose("kill");
  const std::string uid0 = Uid("kill-node-0"), uid1 = Uid("kill-node-1");
  ASSERT_EQ(WaitFinished("kill"), "Succeeded") << Diagnose("kill");

  const json status = h_.Job("kill")["status"];
  EXPECT_EQ(status["restarts"], 1) << status.dump(2);
  EXPECT_EQ(status["lastFailure"]["node"], 1) << status.dump(2);
  EXPECT_EQ(status["lastFailure"]["rank"], 1) << status.dump(2);
  EXPECT_EQ(status["lastFailure"]["reason"], "Killed") << status.dump(2);
  EXPECT_EQ(status["lastFailure"]["inPlace"], true) << status.dump(2);
  // No pod created or deleted: the same two incarnations ran both attempts.
  EXPECT_EQ(Uid("kill-node-0"), uid0);
  EXPECT_EQ(Uid("kill-node-1"), uid1);
  const std::string log0 = PodLogs(h_, "kill-node-0"), log1 = PodLogs(h_, "kill-node-1");
  const auto params = FinalParams(log0 + log1);
  ASSERT_EQ(params.size(), 2u) << log0 << log1;
  EXPECT_EQ(params.at("0"), params.at("1")) << "both ranks hold the same parameters";
  for (int rank : {0, 1}) {
    auto pids = WorkerPids(rank == 0 ? log0 : log1, rank);
    ASSERT_TRUE(pids.count(0) && pids.count(1)) << (rank == 0 ? log0 : log1);
    EXPECT_EQ(pids[0], pids[1]) << "rank " << rank << "'s loader workers were replaced";
  }
  // As a recreated gang shows it: the Restarting phase (kubectl get tj -w) and both events.
  ASSERT_TRUE(h_.WaitFor([&] { return CountEvents("kill", "Restarted") == 1; }, seconds(20)))
      << Diagnose("kill");
  EXPECT_EQ(CountEvents("kill", "Restarting"), 1);
  EXPECT_GE(CountEvents("kill", "NodeFailed"), 1);
  ASSERT_TRUE(h_.WaitFor([&] { return watch->Stdout().find("Succeeded 1") != std::string::npos; },
                         seconds(20)))
      << watch->Stdout();
  EXPECT_THAT(watch->Stdout(), HasSubstr("Restarting 1\n"));
  EXPECT_THAT(watch->Stdout(), HasSubstr("Running 1\n"));
}

// Warm standby ranks (issue 36) in an in-place restart: a Python rank on each node
// (tests/data/standby/train.py, Debian's torch, gloo) gets its standby while the first attempt
// runs; once both are ready the test opens the gate and rank 1 SIGKILLs itself. Both nodes'
// agents restart their rank in its standby (the same pid prints the attempt-1 line), in the
// new attempt's environment, and the job Succeeds in place.
TEST_F(InPlaceEndToEnd, AnInPlaceRestartStartsEachPythonRankInItsStandby) {
  const std::string gate = h_.dir() + "/standby-gate";
  ApplyJob("standby", "[/usr/bin/python3]",
           "[\"" STANDBY_DATA "/train.py\", \"" + gate + "\", '1']",
           /*max_restarts=*/1, /*backoff_seconds=*/0, /*workers=*/0);
  static const std::regex ready(R"(rank (\d)'s standby \(pid (\d+)\) is ready for a restart)");
  std::map<int, std::string> standby;  // rank -> pid
  ASSERT_TRUE(h_.WaitFor(
      [&] {
        for (const char* pod : {"standby-node-0", "standby-node-1"}) {
          const std::string log = PodLogs(h_, pod);
          std::smatch m;
          if (std::regex_search(log, m, ready)) standby[std::stoi(m[1])] = m[2];
        }
        return standby.size() == 2;
      },
      seconds(180)))
      << Diagnose("standby");
  const std::string uid0 = Uid("standby-node-0"), uid1 = Uid("standby-node-1");
  spawnpoint::testing::WriteFile(gate, "");
  ASSERT_EQ(WaitFinished("standby", seconds(180)), "Succeeded") << Diagnose("standby");
  EXPECT_EQ(h_.Job("standby")["status"]["restarts"], 1);
  EXPECT_EQ(Uid("standby-node-0"), uid0);
  EXPECT_EQ(Uid("standby-node-1"), uid1);
  for (int rank : {0, 1}) {
    const std::string log = PodLogs(h_, "standby-node-" + std::to_string(rank));
    EXPECT_THAT(log, HasSubstr("rank " + std::to_string(rank) +
                               " starts in its warm standby (pid " + standby[rank] + ")"))
        << log;
    // The standby ran the script as attempt 1, in attempt 1's environment.
    EXPECT_THAT(log, HasSubstr("top-level side effect pid=" + standby[rank] + " attempt=1 "))
        << log;
    EXPECT_THAT(log, HasSubstr("done pid=" + standby[rank] + " attempt=1")) << log;
  }
}

// Recreate keeps today's behaviour: the same death recreates both pods (new UIDs, the next
// attempt label) and the job Succeeds with one restart.
TEST_F(InPlaceEndToEnd, RecreateStillRecreatesTheGang) {
  ApplyJob("recreate", "[\"" TRAINER_BIN "\"]",
           "[--epochs, '2', --steps-per-epoch, '40', --fail-at-step, '20', --fail-rank, '1', "
           "--fail-signal, '9']",
           /*max_restarts=*/3, /*backoff_seconds=*/10, /*workers=*/2, "Recreate");
  ASSERT_TRUE(h_.WaitFor(
      [&] { return PodRunning("recreate-node-0") && PodRunning("recreate-node-1"); }, seconds(60)))
      << Diagnose("recreate");
  const std::string uid0 = Uid("recreate-node-0"), uid1 = Uid("recreate-node-1");
  ASSERT_EQ(WaitFinished("recreate"), "Succeeded") << Diagnose("recreate");
  const json status = h_.Job("recreate")["status"];
  EXPECT_EQ(status["restarts"], 1) << status.dump(2);
  EXPECT_FALSE(status.contains("gangAttempt")) << status.dump(2);
  EXPECT_NE(Uid("recreate-node-0"), uid0);
  EXPECT_NE(Uid("recreate-node-1"), uid1);
  EXPECT_EQ(JsonField(h_.Pod("recreate-node-1"), "/metadata/labels/spawnpoint.dev~1attempt"), "1");
}

// `kubectl delete pod`: node 1's pod, then the coordinator's (node 0): each time only that pod
// is recreated, under its name, while the other keeps its UID; the job Succeeds.
TEST_F(InPlaceEndToEnd, ADeletedPodIsRecreatedAloneAndTheJobSucceeds) {
  // Each attempt starts from step 0 and only has to outlast the test's next delete, which
  // follows its first epoch line at once: 300 steps (~40 s here, quiet).
  ApplyJob("lose", "[\"" TRAINER_BIN "\"]", "[--epochs, '2', --steps-per-epoch, '150']",
           /*max_restarts=*/3, /*backoff_seconds=*/10);
  auto training = [&](int restarts) {
    return [this, restarts] {
      const std::string logs = PodLogs(h_, "lose-node-0");
      return h_.Phase("lose") == "Running" &&
             JsonField(h_.Job("lose"), "/status/restarts") == std::to_string(restarts) &&
             logs.find("loader rank=0 epoch=0 restart=" + std::to_string(restarts)) !=
                 std::string::npos;
    };
  };
  ASSERT_TRUE(h_.WaitFor(training(0), seconds(60))) << Diagnose("lose");
  const std::string uid0 = Uid("lose-node-0"), uid1 = Uid("lose-node-1");

  KubectlResult del = h_.Kubectl({"delete", "pod", "lose-node-1", "--wait=false"});
  ASSERT_EQ(del.code, 0) << del.err;
  ASSERT_TRUE(h_.WaitFor(
      [&] {
        const std::string uid = Uid("lose-node-1");
        return !uid.empty() && uid != uid1 && PodRunning("lose-node-1");
      },
      seconds(60)))
      << Diagnose("lose");
  EXPECT_EQ(Uid("lose-node-0"), uid0) << "node 0's pod was replaced";
  ASSERT_TRUE(h_.WaitFor(training(1), seconds(60))) << Diagnose("lose");
  EXPECT_EQ(h_.Job("lose")["status"]["lastFailure"]["node"], 1);
  const std::string uid1b = Uid("lose-node-1");

  // The coordinator's pod: node 1's agent holds its ranks stopped until the new one is up.
  del = h_.Kubectl({"delete", "pod", "lose-node-0", "--wait=false"});
  ASSERT_EQ(del.code, 0) << del.err;
  ASSERT_TRUE(h_.WaitFor(
      [&] {
        const std::string uid = Uid("lose-node-0");
        return !uid.empty() && uid != uid0 && PodRunning("lose-node-0");
      },
      seconds(60)))
      << Diagnose("lose");
  EXPECT_EQ(Uid("lose-node-1"), uid1b) << "node 1's pod was replaced";
  ASSERT_EQ(WaitFinished("lose"), "Succeeded") << Diagnose("lose");
  const json status = h_.Job("lose")["status"];
  EXPECT_EQ(status["restarts"], 2) << status.dump(2);
  EXPECT_EQ(status["lastFailure"]["node"], 0) << status.dump(2);
  EXPECT_EQ(Uid("lose-node-1"), uid1b);
  const auto params = FinalParams(PodLogs(h_, "lose-node-0") + PodLogs(h_, "lose-node-1"));
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params.at("0"), params.at("1"));
}

// The job's one budget: ranks that always fail end the job with MaxRestartsReached after
// exactly 2 restarts in place (the pods kept), the second one while the coordinator's pod is
// being replaced when `delete_coordinator`.
void BudgetIsSpent(InPlaceEndToEnd* t, OperatorHarness& h, bool delete_coordinator) {
  const std::string job = delete_coordinator ? "budget-coord" : "budget";
  // Each rank kills itself a second after it starts. The budget's last attempt (restart 2)
  // waits for the test's gate first: the coordinator's pod is deleted before that attempt can
  // fail, whether it lands in the 6 s backoff before it (as a quick test's delete does) or
  // once it has started (a loaded machine's). Without the gate a delete later than ~7 s came
  // after the job had Failed, and nothing recreated the pod.
  // (A file, not `kill -9 $$` in the manifest: the kubelet's expansion makes `$$` a `$`.)
  const std::string gate = h.dir() + "/" + job + ".gate";
  const std::string rank = h.dir() + "/" + job + "_rank.py";
  spawnpoint::testing::WriteFile(rank, R"(import os, signal, sys, time
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
time.sleep(1)
while attempt >= 2 and not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
)");
  if (!delete_coordinator) spawnpoint::testing::WriteFile(gate, "");
  t->ApplyJob(job, "[/usr/bin/python3]", "['" + rank + "', '" + gate + "']",
              /*max_restarts=*/2,
              /*backoff_seconds=*/6, /*workers=*/0);
  // Both pods, before their UIDs are read (node 1's may be created a moment after node 0's).
  ASSERT_TRUE(
      h.WaitFor([&] { return t->PodRunning(job + "-node-0") && t->PodRunning(job + "-node-1"); },
                seconds(60)))
      << t->Diagnose(job);
  const std::string uid1 = t->Uid(job + "-node-1");
  std::string uid0 = t->Uid(job + "-node-0");
  if (delete_coordinator) {
    ASSERT_TRUE(
        h.WaitFor([&] { return JsonField(h.Job(job), "/status/restarts") == "2"; }, seconds(60)))
        << t->Diagnose(job);
    KubectlResult del = h.Kubectl({"delete", "pod", job + "-node-0", "--wait=false"});
    ASSERT_EQ(del.code, 0) << del.err;
    ASSERT_TRUE(h.WaitFor(
        [&] {
          const std::string uid = t->Uid(job + "-node-0");
          return !uid.empty() && uid != uid0;
        },
        seconds(60)))
        << t->Diagnose(job);
    uid0 = t->Uid(job + "-node-0");
    spawnpoint::testing::WriteFile(gate, "");
  }
  ASSERT_EQ(t->WaitFinished(job), "Failed") << t->Diagnose(job);
  const json status = h.Job(job)["status"];
  // Which of the two it was: the rank's own kill, or "the gang's coordinator was lost".
  std::printf("the budget's last attempt ended: %s\n", status["lastFailure"].dump().c_str());
  EXPECT_EQ(status["restarts"], 2) << status.dump(2);
  std::string reason;
  for (const auto& c : status["conditions"]) {
    if (c["type"] == "Failed") reason = c.value("reason", "");
  }
  EXPECT_EQ(reason, "MaxRestartsReached") << status.dump(2);
  EXPECT_EQ(status["lastFailure"]["reason"], "Killed") << status.dump(2);
  EXPECT_EQ(t->Uid(job + "-node-1"), uid1) << "node 1's pod was replaced";
  EXPECT_EQ(t->Uid(job + "-node-0"), uid0) << "node 0's pod was replaced";
  EXPECT_EQ(t->CountEvents(job, "Restarting"), 2) << t->Diagnose(job);
}

TEST_F(InPlaceEndToEnd, RanksThatAlwaysFailSpendTheBudgetInPlace) {
  BudgetIsSpent(this, h_, false);
}

TEST_F(InPlaceEndToEnd, TheBudgetSurvivesTheCoordinatorsPod) { BudgetIsSpent(this, h_, true); }

}  // namespace
}  // namespace spawnpoint::op::testing
