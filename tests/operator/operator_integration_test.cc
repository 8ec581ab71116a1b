// The operator binary against the real control plane of the operator_cluster fixture (its
// local node simulates pods: bound ones are Running; the test finishes them by patching
// pods/status as a kubelet would), driven with the real kubectl. Each test has its own
// namespace, fault proxy and operator (tests/operator/harness.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "tests/metrics/agent_harness.h"
#include "tests/operator/harness.h"

namespace spawnpoint::op::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

json Env(const json& container, const std::string& name) {
  for (const auto& e : container.value("env", json::array())) {
    if (e["name"] == name) return e;
  }
  return json();
}

class OperatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = std::make_unique<OperatorHarness>();
    ASSERT_TRUE(h_->ok()) << h_->error();
  }
  void StartOperator(std::vector<std::string> extra = {}) { h_->StartOperator(extra); }

  // Applies `job` and waits until its gang runs.
  void ApplyRunning(const json& job, int nodes = 2) {
    const std::string name = job["metadata"]["name"];
    ASSERT_TRUE(h_->Apply(job));
    ASSERT_TRUE(h_->WaitPhase(name, "Running")) << h_->Job(name).dump(2) << h_->Log();
    ASSERT_EQ(h_->Pods(name).size(), static_cast<size_t>(nodes));
  }

  std::set<std::string> PodUids(const std::string& job) {
    std::set<std::string> uids;
    for (const auto& p : h_->Pods(job)) uids.insert(p["metadata"]["uid"]);
    return uids;
  }

  std::unique_ptr<OperatorHarness> h_;
};

TEST_F(OperatorTest, TwoNodeJobGetsServiceAndPodsAndKubectlShowsTheColumns) {
  StartOperator({"--agent-image", "registry.example/spawnpoint-agent:1.0"});
  json job = TestJob("resnet", 2);
  job["spec"]["gpusPerNode"] = 2;
  job["spec"]["backend"] = "nccl";
  job["spec"]["shmSize"] = "2Gi";
  job["spec"]["rendezvous"]["port"] = 29600;
  job["spec"]["template"]["metadata"]["labels"]["team"] = "vision";
  // valueFrom entries are the kubelet's to resolve: the pod keeps them as written, and the
  // agent hands the pod's environment to the ranks.
  job["spec"]["template"]["spec"]["containers"][0]["env"] = {
      {{"name", "NCCL_DEBUG"}, {"value", "INFO"}},
      {{"name", "TRAINER_POD"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
      {{"name", "WANDB_KEY"},
       {"valueFrom", {{"secretKeyRef", {{"name", "wandb"}, {"key", "token"}}}}}}};
  ApplyRunning(job);
  const json tj = h_->Job("resnet");

  // The headless service: DNS for every pod before readiness, the rendezvous port.
  auto svc = h_->Api("GET", "/api/v1/namespaces/$NS/services/resnet").Json();
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(svc["spec"]["selector"]["spawnpoint.dev/job-name"], "resnet");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 29600);
  EXPECT_EQ(svc["metadata"]["ownerReferences"][0]["uid"], tj["metadata"]["uid"]);

  json pods = h_->Pods("resnet");
  for (int i = 0; i < 2; ++i) {
    const json& pod = pods[i];
    const std::string name = "resnet-node-" + std::to_string(i);
    SCOPED_TRACE(name);
    EXPECT_EQ(pod["metadata"]["name"], name);
    EXPECT_EQ(pod["metadata"]["labels"]["spawnpoint.dev/job-name"], "resnet");
    EXPECT_EQ(pod["metadata"]["labels"]["spawnpoint.dev/node-rank"], std::to_string(i));
    EXPECT_EQ(pod["metadata"]["labels"]["spawnpoint.dev/attempt"], "0");
    EXPECT_EQ(pod["metadata"]["labels"]["team"], "vision");
    const json& owner = pod["metadata"]["ownerReferences"][0];
    EXPECT_EQ(owner["kind"], "TrainingJob");
    EXPECT_EQ(owner["uid"], tj["metadata"]["uid"]);
    EXPECT_EQ(owner["controller"], true);
    EXPECT_EQ(owner["blockOwnerDeletion"], true);
    const json& spec = pod["spec"];
    EXPECT_EQ(spec["restartPolicy"], "Never");
    EXPECT_EQ(spec["hostname"], name);
    EXPECT_EQ(spec["subdomain"], "resnet");
    EXPECT_EQ(spec["initContainers"][0]["image"], "registry.example/spawnpoint-agent:1.0");
    const json& c = spec["containers"][0];
    EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "2");
    EXPECT_EQ(c["command"][0], "/spawnpoint/bin/spawnpoint-agent");
    EXPECT_EQ(c["command"][1], "run");
    EXPECT_EQ(Env(c, "MASTER_ADDR")["value"], "resnet-node-0.resnet");
    EXPECT_EQ(Env(c, "MASTER_PORT")["value"], "29600");
    EXPECT_EQ(Env(c, "WORLD_SIZE")["value"], "4");
    EXPECT_EQ(Env(c, "NODE_RANK")["value"], std::to_string(i));
    EXPECT_EQ(Env(c, "NNODES")["value"], "2");
    EXPECT_EQ(Env(c, "NCCL_DEBUG")["value"], "INFO");
    EXPECT_EQ(Env(c, "TRAINER_POD")["valueFrom"],
              json({{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", "metadata.name"}}}}));
    EXPECT_EQ(Env(c, "WANDB_KEY")["valueFrom"]["secretKeyRef"],
              json({{"name", "wandb"}, {"key", "token"}}));
    EXPECT_THAT(Env(c, "SPAWNPOINT_JOB")["value"].get<std::string>(),
                HasSubstr("\"python3\",\"train.py\""));
    bool shm = false, shm_mount = false;
    for (const auto& v : spec["volumes"]) {
      if (v["name"] == "spawnpoint-shm") {
        shm = v["emptyDir"]["medium"] == "Memory" && v["emptyDir"]["sizeLimit"] == "2Gi";
      }
    }
    for (const auto& m : c["volumeMounts"]) shm_mount |= m["mountPath"] == "/dev/shm";
    EXPECT_TRUE(shm && shm_mount) << spec.dump(2);
  }

  // kubectl get tj: the printer columns, by short name.
  KubectlResult get = h_->Kubectl({"get", "tj"});
  ASSERT_EQ(get.code, 0) << get.err;
  auto lines = Lines(get.out);
  ASSERT_EQ(lines.size(), 2u) << get.out;
  EXPECT_EQ(Words(lines[0]),
            (std::vector<std::string>{"NAME", "PHASE", "NODES", "GPUS", "RESTARTS", "GPU-UTIL",
                                      "DATA-STALL", "STALLED", "UPDATED", "STALE", "AGE"}));
  auto row = Words(lines[1]);
  ASSERT_GE(row.size(), 6u) << get.out;
  EXPECT_EQ(row[0], "resnet");
  EXPECT_EQ(row[1], "Running");
  EXPECT_EQ(row[2], "2");
  EXPECT_EQ(row[3], "4");
  EXPECT_EQ(row[4], "0");
  KubectlResult all = h_->Kubectl({"get", "all"});
  EXPECT_THAT(all.out, HasSubstr("trainingjob.spawnpoint.dev/resnet"));

  KubectlResult explain = h_->Kubectl({"explain", "tj.spec.loader"});
  ASSERT_EQ(explain.code, 0) << explain.err;
  EXPECT_THAT(explain.out, HasSubstr("workersPerRank"));
  EXPECT_THAT(explain.out, HasSubstr("Only spawn is accepted"));
  KubectlResult explain_status = h_->Kubectl({"explain", "tj.status.lastFailure"});
  EXPECT_THAT(explain_status.out, HasSubstr("exitCode"));

  // Every example manifest is accepted by the CRD's schema.
  int examples = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SOURCE_DIR "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    ++examples;
    KubectlResult applied = h_->Kubectl({"apply", "-f", entry.path().string()});
    EXPECT_EQ(applied.code, 0) << entry.path() << ": " << applied.err;
  }
  EXPECT_GE(examples, 3);
  KubectlResult listed = h_->Kubectl({"get", "tj", "-o", "name"});
  EXPECT_THAT(listed.out, HasSubstr("trainingjob.spawnpoint.dev/local-cluster"));
}

TEST_F(OperatorTest, SucceedsOnlyWhenEveryPodSucceeded) {
  StartOperator();
  ApplyRunning(TestJob("ok"));
  h_->SucceedPod("ok-node-0");
  ASSERT_TRUE(
      h_->WaitFor([&] { return JsonField(h_->Job("ok"), "/status/nodes/succeeded") == "1"; }));
  EXPECT_EQ(h_->Phase("ok"), "Running");
  h_->SucceedPod("ok-node-1");
  ASSERT_TRUE(h_->WaitPhase("ok", "Succeeded"));
  json status = h_->Job("ok")["status"];
  EXPECT_TRUE(status.contains("completionTime"));
  EXPECT_TRUE(status.contains("startTime"));
  // cleanPodPolicy Running: finished pods stay (logs), the service goes.
  EXPECT_TRUE(h_->WaitFor([&] { return !h_->HasService("ok"); }));
  EXPECT_EQ(h_->Pods("ok").size(), 2u);
  EXPECT_TRUE(h_->WaitFor([&] {
    for (const auto& e : h_->Events("ok")) {
      if (e.value("reason", "") == "Succeeded") return true;
    }
    return false;
  }));
}

TEST_F(OperatorTest, RetryableFailureRestartsTheGangNowThenAfterBackoff) {
  StartOperator();
  ApplyRunning(TestJob("retry", 2, /*max_restarts=*/3, /*backoff=*/1));
  const auto first = PodUids("retry");
  h_->FailPod("retry-node-1", 137, "OOMKilled");
  ASSERT_TRUE(h_->WaitFor([&] { return JsonField(h_->Job("retry"), "/status/restarts") == "1"; }));
  json status = h_->Job("retry")["status"];
  EXPECT_EQ(status["lastFailure"]["node"], 1);
  EXPECT_EQ(status["lastFailure"]["exitCode"], 137);
  EXPECT_EQ(status["lastFailure"]["reason"], "OOMKilled");

  EXPECT_EQ(status["lastFailure"]["quickFailures"], 1);

  // The whole gang is replaced: new UIDs for both pods, attempt `attempt`.
  auto replaced = [&](const std::set<std::string>& old, const std::string& attempt) {
    return h_->WaitFor([&] {
      json pods = h_->Pods("retry");
      if (pods.size() != 2) return false;
      for (const auto& p : pods) {
        if (old.count(p["metadata"]["uid"]) ||
            JsonField(p, "/metadata/labels/spawnpoint.dev~1attempt") != attempt) {
          return false;
        }
      }
      return true;
    });
  };
  ASSERT_TRUE(replaced(first, "1"));  // at once: a first failure waits for nothing
  ASSERT_TRUE(h_->WaitPhase("retry", "Running")) << h_->Job("retry").dump(2);
  // A second failure soon after: the gang waits out backoffSeconds (1 s) this time.
  const auto second = PodUids("retry");
  const auto failed_again_at = std::chrono::steady_clock::now();
  h_->FailPod("retry-node-0", 137, "OOMKilled");
  ASSERT_TRUE(replaced(second, "2"));
  EXPECT_GE(std::chrono::steady_clock::now() - failed_again_at, milliseconds(900));
  ASSERT_TRUE(h_->WaitPhase("retry", "Running")) << h_->Job("retry").dump(2);
  status = h_->Job("retry")["status"];
  EXPECT_EQ(status["restarts"], 2);
  EXPECT_EQ(status["lastFailure"]["quickFailures"], 2);
  for (const auto& c : status["conditions"]) {
    if (c["type"] == "Restarting") {
      EXPECT_EQ(c["status"], "False") << "cleared once the gang runs";
    }
  }
  std::set<std::string> reasons;
  for (const auto& e : h_->Events("retry")) reasons.insert(e["reason"]);
  EXPECT_TRUE(reasons.count("NodeFailed") && reasons.count("Restarting")) << h_->Log();
}

TEST_F(OperatorTest, NonRetryableExitFailsWithLastFailure) {
  StartOperator();
  ApplyRunning(TestJob("bad"));
  h_->FailPod("bad-node-1", 1, "Error", "ValueError: bad learning rate");
  ASSERT_TRUE(h_->WaitPhase("bad", "Failed"));
  json status = h_->Job("bad")["status"];
  EXPECT_EQ(status["restarts"], 0);
  EXPECT_EQ(status["lastFailure"]["node"], 1);
  EXPECT_EQ(status["lastFailure"]["exitCode"], 1);
  EXPECT_EQ(status["lastFailure"]["message"], "ValueError: bad learning rate");
  EXPECT_TRUE(status.contains("completionTime"));
  // The still-running peer is stopped; the failed pod stays for its logs.
  EXPECT_TRUE(h_->WaitFor([&] { return h_->Pods("bad").size() == 1; }));
  EXPECT_EQ(h_->Pods("bad")[0]["metadata"]["name"], "bad-node-1");
  KubectlResult events =
      h_->Kubectl({"get", "events", "--field-selector", "involvedObject.name=bad", "-o",
                   "jsonpath={.items[*].message}"});
  EXPECT_THAT(events.out, HasSubstr("exited 1"));
}

TEST_F(OperatorTest, MaxRestartsExhaustedFailsWithReason) {
  StartOperator();
  ApplyRunning(TestJob("flaky", 2, /*max_restarts=*/1, /*backoff=*/0));
  h_->FailPod("flaky-node-0", 143);
  ASSERT_TRUE(h_->WaitFor([&] {
    json pods = h_->Pods("flaky");
    return JsonField(h_->Job("flaky"), "/status/phase") == "Running" && pods.size() == 2 &&
           JsonField(pods[0], "/metadata/labels/spawnpoint.dev~1attempt") == "1";
  }));
  h_->FailPod("flaky-node-0", 143);
  ASSERT_TRUE(h_->WaitPhase("flaky", "Failed"));
  json status = h_->Job("flaky")["status"];
  EXPECT_EQ(status["restarts"], 1);
  bool found = false;
  for (const auto& c : status["conditions"]) {
    if (c["type"] == "Failed") {
      found = true;
      EXPECT_EQ(c["reason"], "MaxRestartsReached");
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(OperatorTest, SuspendAndResume) {
  StartOperator();
  ApplyRunning(TestJob("pause"));
  KubectlResult suspend = h_->Kubectl({"patch", "tj", "pause", "--type", "merge", "-p",
                                       R"({"spec":{"runPolicy":{"suspend":true}}})"});
  ASSERT_EQ(suspend.code, 0) << suspend.err;
  ASSERT_TRUE(h_->WaitPhase("pause", "Suspended"));
  EXPECT_TRUE(h_->WaitFor([&] { return h_->Pods("pause").empty(); }));
  KubectlResult resume = h_->Kubectl({"patch", "tj", "pause", "--type", "merge", "-p",
                                      R"({"spec":{"runPolicy":{"suspend":false}}})"});
  ASSERT_EQ(resume.code, 0) << resume.err;
  ASSERT_TRUE(h_->WaitPhase("pause", "Running"));
  EXPECT_EQ(h_->Pods("pause").size(), 2u);
}

TEST_F(OperatorTest, ActiveDeadlineFailsTheJob) {
  StartOperator();
  json job = TestJob("late");
  job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 2;
  ApplyRunning(job);
  ASSERT_TRUE(h_->WaitPhase("late", "Failed", seconds(10)));
  bool deadline = false;
  const json late = h_->Job("late");
  for (const auto& c : late["status"]["conditions"]) {
    deadline |= c["type"] == "Failed" && c.value("reason", "") == "DeadlineExceeded";
  }
  EXPECT_TRUE(deadline);
  EXPECT_TRUE(h_->WaitFor([&] { return h_->Pods("late").empty(); }));
}

TEST_F(OperatorTest, TtlDeletesTheFinishedJobAndItsChildren) {
  StartOperator();
  json job = TestJob("brief");
  job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 1;
  job["spec"]["runPolicy"]["cleanPodPolicy"] = "None";
  ApplyRunning(job);
  h_->SucceedPod("brief-node-0");
  h_->SucceedPod("brief-node-1");
  // The job is Succeeded for about its TTL (1 s), which polling may miss on a busy machine:
  // its Succeeded event stays.
  ASSERT_TRUE(h_->WaitFor([&] { return h_->Job("brief").is_null(); }, seconds(20)));
  bool succeeded = false;
  for (const auto& e : h_->Events("brief")) succeeded |= e.value("reason", "") == "Succeeded";
  EXPECT_TRUE(succeeded) << "the job was deleted after it had succeeded";
  EXPECT_TRUE(h_->WaitFor([&] { return h_->Pods("brief").empty() && !h_->HasService("brief"); }));
}

TEST_F(OperatorTest, DeletingTheJobDeletesItsChildren) {
  StartOperator();
  ApplyRunning(TestJob("gone"));
  KubectlResult del = h_->Kubectl({"delete", "tj", "gone"});
  ASSERT_EQ(del.code, 0) << del.err;
  EXPECT_TRUE(h_->WaitFor([&] { return h_->Pods("gone").empty() && !h_->HasService("gone"); }));
}

TEST_F(OperatorTest, InvalidSpecIsAFailedConditionWithTheFieldPath) {
  StartOperator();
  json job = TestJob("wrong");
  // A queue without a gang scheduler: valid for the schema (its CEL rules included), not for us.
  job["spec"]["scheduling"] = {{"queue", "team-a"}};
  ASSERT_TRUE(h_->Apply(job));
  ASSERT_TRUE(h_->WaitPhase("wrong", "Failed"));
  json failed;
  const json wrong = h_->Job("wrong");
  for (const auto& c : wrong["status"]["conditions"]) {
    if (c["type"] == "Failed") failed = c;
  }
  EXPECT_EQ(failed["reason"], "InvalidSpec");
  EXPECT_THAT(failed["message"].get<std::string>(), HasSubstr("spec.scheduling.queue"));
  EXPECT_TRUE(h_->Pods("wrong").empty());
}

TEST_F(OperatorTest, HealthReadinessAndMetrics) {
  StartOperator();
  int port = h_->ProbePort();
  ASSERT_GT(port, 0) << h_->Log();
  auto get = [&](const std::string& path) {
    return spawnpoint::testing::HttpCall(port, "GET", path);
  };
  EXPECT_EQ(get("/healthz").code, 200);
  EXPECT_TRUE(h_->WaitFor([&] { return get("/readyz").code == 200; })) << get("/readyz").body;
  ApplyRunning(TestJob("watched"));
  std::string metrics;
  EXPECT_TRUE(h_->WaitFor([&] {
    metrics = get("/metrics").body;
    return metrics.find("spawnpoint_jobs{namespace=\"" + h_->ns() + "\",phase=\"Running\"} 1\n") !=
           std::string::npos;
  })) << metrics;
  EXPECT_THAT(metrics,
              HasSubstr("spawnpoint_reconcile_duration_seconds_count{result=\"success\"}"));
  EXPECT_THAT(metrics,
              HasSubstr("spawnpoint_jobs_created_total{namespace=\"" + h_->ns() + "\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("spawnpoint_leader 1\n"));
  EXPECT_THAT(metrics, HasSubstr("spawnpoint_api_requests_total{verb=\"POST\",code=\"201\"}"));
  EXPECT_THAT(metrics, HasSubstr("spawnpoint_api_requests_total{verb=\"WATCH\",code=\"200\"}"));
  EXPECT_THAT(metrics, HasSubstr("spawnpoint_workqueue_adds_total "));
  // The job's True conditions (the chart's alerts select them), and the namespace's
  // admission-wait histogram from its first status write on.
  EXPECT_THAT(metrics,
              HasSubstr("spawnpoint_job_condition{namespace=\"" + h_->ns() +
                        "\",job=\"watched\",type=\"Running\",reason=\"GangRunning\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("spawnpoint_job_admission_wait_seconds_count{namespace=\"" +
                                 h_->ns() + "\"} 0\n"));
  // The operator's real exposition, as Prometheus' own linter sees it.
  auto promtool = spawnpoint::testing::PromtoolCheckMetrics(metrics);
  if (promtool) {
    EXPECT_EQ(promtool->code, 0) << promtool->output;
    EXPECT_EQ(promtool->output, "") << "promtool has remarks";
  } else {
    ADD_FAILURE() << "promtool is not installed (scripts/install-deps.sh installs it)";
  }
  EXPECT_THAT(h_->Log(), HasSubstr("job=" + h_->ns() + "/watched reconcile=r"));
  EXPECT_EQ(h_->Log().find("dummy"), std::string::npos) << "no token in the logs";
}

TEST_F(OperatorTest, PodPendingTooLongIsNamedInStatus) {
  StartOperator({"--pending-timeout", "1s"});
  json job = TestJob("stuck", 1);
  // No node has this name: the simulated scheduler leaves the pod Pending.
  job["spec"]["template"]["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "gpu-node-9"}};
  ASSERT_TRUE(h_->Apply(job));
  json running;
  ASSERT_TRUE(h_->WaitFor([&] {
    const json tj = h_->Job("stuck");
    if (!tj.is_object() || !tj.contains("status")) return false;
    for (const auto& c : tj["status"].value("conditions", json::array())) {
      if (c["type"] == "Running" && c.value("reason", "") == "PodPending") running = c;
    }
    return !running.is_null();
  })) << h_->Job("stuck").dump(2)
      << h_->Log();
  EXPECT_THAT(running["message"].get<std::string>(),
              HasSubstr("pod stuck-node-0 has been Pending for"));
  EXPECT_EQ(h_->Phase("stuck"), "Pending") << h_->Job("stuck").dump(2);
}

// Robustness.

TEST_F(OperatorTest, KilledBetweenPodsThenRestartedMakesExactlyTheGang) {
  int first = h_->StartOperator({"--crash-after-pod-creates", "1"}, "op-crash");
  ASSERT_TRUE(h_->Apply(TestJob("crash")));
  ASSERT_EQ(h_->op(first).Wait(seconds(15)), 99) << h_->Log(first);
  ASSERT_EQ(h_->Pods("crash").size(), 1u);
  EXPECT_EQ(h_->Pods("crash")[0]["metadata"]["name"], "crash-node-0");
  h_->StartOperator({}, "op-after");
  ASSERT_TRUE(h_->WaitPhase("crash", "Running")) << h_->Log(1);
  EXPECT_EQ(h_->Pods("crash").size(), 2u);
  int creates = 0;
  const json log = h_->Requests();
  for (const auto& r : log["requests"]) {
    // A dry-run create (the quota check before a whole gang, quota_policy.h) stores nothing.
    if (r.value("verb", "") == "create" && r.value("resource", "") == "pods" && r["code"] == 201 &&
        r.value("query", "").find("dryRun") == std::string::npos) {
      ++creates;
    }
  }
  EXPECT_EQ(creates, 2) << "no pod was created twice";
}

TEST_F(OperatorTest, InjectedConflictsErrorsAndThrottlingReachTheSameFinalState) {
  StartOperator();
  ASSERT_TRUE(h_->WaitFor([&] { return h_->Log().find("starting workers") != std::string::npos; }));
  auto added = h_->AddFaults(
      R"({"seed": 7, "rules": [
        {"verb": "*", "resource": "*", "code": 409, "rate": 0.07},
        {"verb": "*", "resource": "*", "code": 500, "rate": 0.07},
        {"verb": "*", "resource": "*", "code": 429, "rate": 0.07, "retryAfter": 0}]})");
  ASSERT_EQ(added.code, 200) << added.body;
  for (const char* name : {"f-ok", "f-retry", "f-bad"}) {
    auto r = h_->Api("POST", "/apis/spawnpoint.dev/v1alpha1/namespaces/$NS/trainingjobs",
                     TestJob(name, 2, 3, 1).dump());
    ASSERT_EQ(r.code, 201) << r.body;
  }
  for (const char* name : {"f-ok", "f-retry", "f-bad"}) {
    ASSERT_TRUE(h_->WaitPhase(name, "Running", seconds(30))) << name << h_->Log();
  }
  h_->FailPod("f-retry-node-0", 137);
  h_->FailPod("f-bad-node-1", 2);
  h_->SucceedPod("f-ok-node-0");
  h_->SucceedPod("f-ok-node-1");
  ASSERT_TRUE(h_->WaitPhase("f-ok", "Succeeded", seconds(30)));
  ASSERT_TRUE(h_->WaitPhase("f-bad", "Failed", seconds(30)));
  ASSERT_TRUE(h_->WaitFor(
      [&] {
        json job = h_->Job("f-retry");
        json pods = h_->Pods("f-retry");
        return JsonField(job, "/status/phase") == "Running" &&
               JsonField(job, "/status/restarts") == "1" && pods.size() == 2 &&
               JsonField(pods[1], "/metadata/labels/spawnpoint.dev~1attempt") == "1";
      },
      seconds(30)))
      << h_->Job("f-retry").dump(2);
  h_->SucceedPod("f-retry-node-0");
  h_->SucceedPod("f-retry-node-1");
  ASSERT_TRUE(h_->WaitPhase("f-retry", "Succeeded", seconds(30)));
  EXPECT_EQ(JsonField(h_->Job("f-retry"), "/status/restarts"), "1");
  EXPECT_EQ(JsonField(h_->Job("f-bad"), "/status/lastFailure/exitCode"), "2");
  EXPECT_EQ(JsonField(h_->Job("f-ok"), "/status/restarts"), "0");
  int faults = 0;
  const json log = h_->Requests();
  for (const auto& r : log["requests"]) {
    if (!r.value("fault", "").empty()) ++faults;
  }
  EXPECT_GT(faults, 10) << "faults were injected";
  h_->ClearFaults();
}

TEST_F(OperatorTest, CutWatchesAndGoneMissNoTransition) {
  // Every pod watch is cut after one event, half-way through the next line; job watches
  // after two events. Rules apply when a watch opens, so they are in place before the
  // operator starts.
  auto added = h_->AddFaults(
      "verb=watch,resource=pods,cutAfterEvents=1,midLine=true;"
      "verb=watch,resource=trainingjobs,cutAfterEvents=2,midLine=true,count=20");
  ASSERT_EQ(added.code, 200) << added.body;
  StartOperator();
  ApplyRunning(TestJob("cut"));
  // The next pod watch to open is answered 410 Gone (as after a compaction): the pod
  // informer must relist, and the transitions below fall right into that gap.
  added = h_->AddFaults("verb=watch,resource=pods,code=410,count=1");
  ASSERT_EQ(added.code, 200) << added.body;
  h_->SucceedPod("cut-node-0");
  h_->SucceedPod("cut-node-1");
  ASSERT_TRUE(h_->WaitPhase("cut", "Succeeded", seconds(30))) << h_->Log();
  EXPECT_THAT(h_->Log(), HasSubstr("watch interrupted"));
  EXPECT_TRUE(h_->WaitFor([&] { return h_->Log().find("relisting") != std::string::npos; }))
      << h_->Log();
}

TEST_F(OperatorTest, TwoLeaderElectedOperatorsOnlyOneWritesAndFailoverIsFast) {
  const std::vector<std::string> le = {
      "--leader-elect", "--leader-elect-lease-duration", "2s",   "--leader-elect-renew-deadline",
      "1500ms",         "--leader-elect-retry-period",   "250ms"};
  int a = h_->StartOperator(le, "op-a");
  ASSERT_TRUE(h_->WaitFor([&] {
    return h_->Log(a).find("became the leader") != std::string::npos;
  })) << h_->Log(a);
  int b = h_->StartOperator(le, "op-b");
  int port_b = h_->ProbePort(b);
  ASSERT_GT(port_b, 0);
  // The follower is ready: standing by behind a leader it has seen.
  ASSERT_TRUE(h_->WaitFor([&] {
    auto r = spawnpoint::testing::HttpCall(port_b, "GET", "/readyz");
    return r.code == 200 && r.body.find("standing by for op-a") != std::string::npos;
  })) << h_->Log(b);

  ApplyRunning(TestJob("led"));
  auto writers = [&] {
    std::set<std::string> agents;
    const json log = h_->Requests();
    for (const auto& r : log["requests"]) {
      const std::string verb = r.value("verb", "");
      const std::string resource = r.value("resource", "");
      if (resource == "leases" ||
          r.value("userAgent", "").find("spawnpoint-operator") == std::string::npos)
        continue;
      if (verb == "create" || verb == "update" || verb == "patch" || verb == "delete") {
        agents.insert(r.value("userAgent", ""));
      }
    }
    return agents;
  };
  EXPECT_EQ(writers(), (std::set<std::string>{"spawnpoint-operator/op-a"}));

  // Kill the leader without a chance to release the lease: op-b takes over within the lease.
  kill(h_->op(a).pid(), SIGKILL);
  h_->op(a).Wait(seconds(5));
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(h_->WaitFor([&] { return h_->Log(b).find("became the leader") != std::string::npos; },
                          seconds(10)))
      << h_->Log(b);
  const auto failover = std::chrono::steady_clock::now() - killed;
  // How soon within the lease is decided on simulated time (leader_election_test); here only
  // a margin no load can cross: far less than the 10 s op-b would need to be given up on.
  EXPECT_LT(failover, seconds(8)) << "lease 2 s: op-b did not take over when it ran out";
  h_->ClearRequests();
  h_->SucceedPod("led-node-0");
  h_->SucceedPod("led-node-1");
  ASSERT_TRUE(h_->WaitPhase("led", "Succeeded")) << h_->Log(b);
  // Polled: the proxy logs a request once the server has answered it, which may trail the
  // write becoming visible to the test's own reads.
  const std::set<std::string> only_b = {"spawnpoint-operator/op-b"};
  EXPECT_TRUE(h_->WaitFor([&] { return writers() == only_b; }, seconds(10)))
      << ::testing::PrintToString(writers());
}

}  // namespace
}  // namespace spawnpoint::op::testing
