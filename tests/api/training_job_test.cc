// TrainingJob parsing from YAML and JSON: defaults, every validation rule with its exact
// message and source location, multi-document streams and the JSON round trip.

#include "api/training_job.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "api/schema.h"

namespace spawnpoint::api {
namespace {

using nlohmann::json;

const std::string kData = std::string(SPAWNPOINT_SOURCE_DIR) + "/tests/data/good/";

// A valid job; tests append spec fields at line 11, indented by two spaces.
constexpr const char* kBase = R"(apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata:
  name: job
spec:
  template:
    spec:
      containers:
        - name: trainer
          command: [python, train.py]
)";

std::string WithSpec(const std::string& extra) { return kBase + extra; }

TrainingJob ParseOne(const std::string& yaml) {
  auto jobs = ParseTrainingJobs(yaml, "job.yaml");
  EXPECT_TRUE(jobs.ok()) << jobs.status().message();
  if (!jobs.ok() || jobs->size() != 1) {
    ADD_FAILURE() << "expected one job";
    return {};
  }
  return jobs->front();
}

std::string ParseError(const std::string& yaml) {
  auto jobs = ParseTrainingJobs(yaml, "job.yaml");
  if (jobs.ok()) return "accepted";
  EXPECT_EQ(jobs.status().code(), StatusCode::kInvalidArgument);
  return jobs.status().message();
}

TrainingJob LoadOne(const std::string& path) {
  auto jobs = LoadTrainingJobsFile(path);
  EXPECT_TRUE(jobs.ok()) << jobs.status().message();
  if (!jobs.ok() || jobs->size() != 1) return {};
  return jobs->front();
}

TEST(TrainingJob, MinimalManifestGetsEveryDefault) {
  TrainingJob job = LoadOne(kData + "minimal.yaml");
  EXPECT_EQ(job.name, "mnist");
  EXPECT_EQ(job.namespace_, "default");
  EXPECT_EQ(job.source, kData + "minimal.yaml");
  EXPECT_TRUE(job.status.is_null());
  const TrainingJobSpec& s = job.spec;
  EXPECT_EQ(s.nodes, 1);
  EXPECT_EQ(s.gpus_per_node, 0);
  EXPECT_EQ(s.procs_per_node, 1);
  EXPECT_EQ(s.gpu_resource, "nvidia.com/gpu");
  EXPECT_EQ(s.gpu_assignment, GpuAssignment::kShared);
  EXPECT_EQ(s.backend, Backend::kAuto);
  EXPECT_EQ(s.trainer.name, "trainer");
  EXPECT_EQ(s.trainer.image, "ghcr.io/example/mnist:1.0");
  EXPECT_EQ(s.trainer.command, (std::vector<std::string>{"python", "train.py"}));
  EXPECT_TRUE(s.trainer.args.empty());
  EXPECT_TRUE(s.trainer.env.empty());
  EXPECT_EQ(s.trainer.working_dir, "");
  EXPECT_EQ(s.loader.workers_per_rank, std::nullopt);
  EXPECT_EQ(s.loader.prefetch_factor, 2);
  EXPECT_FALSE(s.loader.persistent_workers);
  EXPECT_TRUE(s.loader.pin_memory);
  EXPECT_EQ(s.loader.timeout_seconds, 120);
  EXPECT_EQ(s.loader.seed, 0u);
  EXPECT_EQ(s.loader.start_method, "spawn");
  EXPECT_TRUE(s.loader.worker_command.empty());
  EXPECT_TRUE(s.loader.python_pool);
  EXPECT_EQ(s.loader.preload_modules, (std::vector<std::string>{"torch", "__main__"}));
  EXPECT_EQ(s.restart_policy.max_restarts, 3);
  EXPECT_EQ(s.restart_policy.backoff_seconds, 10);
  EXPECT_TRUE(s.restart_policy.retryable_exit_codes.empty());
  EXPECT_TRUE(s.restart_policy.standby);
  EXPECT_EQ(s.rendezvous_port, 29500);
  EXPECT_EQ(s.shm_size, "8Gi");
  EXPECT_EQ(s.shm_size_bytes, 8LL << 30);
  EXPECT_FALSE(s.run_policy.suspend);
  EXPECT_EQ(s.run_policy.active_deadline_seconds, std::nullopt);
  EXPECT_EQ(s.run_policy.ttl_seconds_after_finished, std::nullopt);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kRunning);
  EXPECT_EQ(RanksPerNode(s), 1);
  EXPECT_EQ(WorldSize(s), 1);
  EXPECT_EQ(EffectiveBackend(s), Backend::kGloo);
}

TEST(TrainingJob, FullManifestSetsEveryField) {
  TrainingJob job = LoadOne(kData + "full.yaml");
  EXPECT_EQ(job.name, "resnet-ddp");
  EXPECT_EQ(job.namespace_, "ml");
  EXPECT_EQ(job.metadata["labels"]["team"], "vision");
  const TrainingJobSpec& s = job.spec;
  EXPECT_EQ(s.nodes, 2);
  EXPECT_EQ(s.gpus_per_node, 4);
  EXPECT_EQ(s.procs_per_node, 2);
  EXPECT_EQ(s.gpu_resource, "amd.com/gpu");
  EXPECT_EQ(s.gpu_assignment, GpuAssignment::kExclusive);
  EXPECT_EQ(s.backend, Backend::kNccl);
  // The container named "trainer" runs the job even when it is not the first.
  EXPECT_EQ(s.trainer.name, "trainer");
  EXPECT_EQ(s.trainer.image, "ghcr.io/example/resnet:2.1");
  EXPECT_EQ(s.trainer.command, (std::vector<std::string>{"python", "-m", "train"}));
  EXPECT_EQ(s.trainer.args, (std::vector<std::string>{"--epochs", "90"}));
  EXPECT_EQ(s.trainer.working_dir, "/workspace");
  // valueFrom entries are for the kubelet: not in env, but still in the template.
  ASSERT_EQ(s.trainer.env.size(), 2u);
  EXPECT_EQ(s.trainer.env[0].name, "BATCH_SIZE");
  EXPECT_EQ(s.trainer.env[0].value, "256");
  EXPECT_EQ(s.trainer.env[1].name, "EMPTY");
  EXPECT_EQ(s.trainer.env[1].value, "");
  EXPECT_EQ(s.pod_template["spec"]["containers"][1]["env"][1]["valueFrom"]["fieldRef"]["fieldPath"],
            "status.podIP");
  EXPECT_EQ(s.pod_template["metadata"]["labels"]["app"], "resnet");
  EXPECT_EQ(s.loader.workers_per_rank, 6);
  EXPECT_EQ(s.loader.prefetch_factor, 4);
  EXPECT_FALSE(s.loader.persistent_workers);
  EXPECT_FALSE(s.loader.pin_memory);
  EXPECT_EQ(s.loader.timeout_seconds, 300);
  EXPECT_EQ(s.loader.seed, 1234u);
  EXPECT_EQ(s.stall_policy.timeout_seconds, 120);
  EXPECT_EQ(s.stall_policy.startup_timeout_seconds, 900);
  EXPECT_EQ(s.stall_policy.action, StallAction::kRestart);
  EXPECT_DOUBLE_EQ(s.stall_policy.straggler_ratio, 2.5);
  EXPECT_EQ(s.loader.worker_command, (std::vector<std::string>{"python", "-m", "loader_worker"}));
  EXPECT_FALSE(s.loader.python_pool);
  EXPECT_EQ(s.loader.preload_modules,
            (std::vector<std::string>{"numpy", "torchvision.transforms"}));
  EXPECT_EQ(s.restart_policy.max_restarts, 5);
  EXPECT_EQ(s.restart_policy.backoff_seconds, 30);
  EXPECT_EQ(s.restart_policy.retryable_exit_codes, (std::vector<int>{137, 143}));
  EXPECT_EQ(s.rendezvous_port, 23456);
  EXPECT_EQ(s.shm_size, "16Gi");
  EXPECT_EQ(s.shm_size_bytes, 16LL << 30);
  EXPECT_TRUE(s.run_policy.suspend);
  EXPECT_EQ(s.run_policy.active_deadline_seconds, 86400);
  EXPECT_EQ(s.run_policy.ttl_seconds_after_finished, 600);
  EXPECT_EQ(s.run_policy.clean_pod_policy, CleanPodPolicy::kAll);
  EXPECT_EQ(RanksPerNode(s), 4);
  EXPECT_EQ(WorldSize(s), 8);
  EXPECT_EQ(EffectiveBackend(s), Backend::kNccl);
}

TEST(TrainingJob, StandbyRanksCanBeTurnedOff) {
  EXPECT_FALSE(
      ParseOne(WithSpec("  restartPolicy: {standby: false}\n")).spec.restart_policy.standby);
  EXPECT_NE(ParseError(WithSpec("  restartPolicy: {standby: maybe}\n"))
                .find("spec.restartPolicy.standby"),
            std::string::npos);
}

TEST(TrainingJob, Helpers) {
  TrainingJobSpec spec;
  spec.nodes = 3;
  spec.procs_per_node = 2;
  EXPECT_EQ(RanksPerNode(spec), 2);
  EXPECT_EQ(WorldSize(spec), 6);
  EXPECT_EQ(EffectiveBackend(spec), Backend::kGloo);
  spec.gpus_per_node = 8;
  EXPECT_EQ(RanksPerNode(spec), 8);
  EXPECT_EQ(WorldSize(spec), 24);
  EXPECT_EQ(EffectiveBackend(spec), Backend::kNccl);
  spec.backend = Backend::kGloo;
  EXPECT_EQ(EffectiveBackend(spec), Backend::kGloo);
  EXPECT_STREQ(BackendName(Backend::kAuto), "auto");
  EXPECT_STREQ(BackendName(Backend::kNccl), "nccl");
  EXPECT_STREQ(BackendName(Backend::kGloo), "gloo");
  EXPECT_STREQ(GpuAssignmentName(GpuAssignment::kShared), "shared");
  EXPECT_STREQ(GpuAssignmentName(GpuAssignment::kExclusive), "exclusive");
  EXPECT_STREQ(CleanPodPolicyName(CleanPodPolicy::kNone), "None");
  EXPECT_STREQ(CleanPodPolicyName(CleanPodPolicy::kRunning), "Running");
  EXPECT_STREQ(CleanPodPolicyName(CleanPodPolicy::kAll), "All");
}

TEST(TrainingJob, ToJsonFillsDefaults) {
  json out = TrainingJobToJson(LoadOne(kData + "minimal.yaml"));
  EXPECT_EQ(out["apiVersion"], "spawnpoint.dev/v1alpha1");
  EXPECT_EQ(out["kind"], "TrainingJob");
  EXPECT_EQ(out["metadata"], json({{"name", "mnist"}}));
  EXPECT_FALSE(out.contains("status"));
  json expected_spec = json::parse(R"({
    "nodes": 1, "gpusPerNode": 0, "procsPerNode": 1, "gpuResource": "nvidia.com/gpu",
    "gpuAssignment": "shared", "backend": "auto",
    "template": {"spec": {"containers": [{"name": "trainer", "image": "ghcr.io/example/mnist:1.0",
                                          "command": ["python", "train.py"]}]}},
    "loader": {"workersPerRank": "auto", "prefetchFactor": 2, "persistentWorkers": false,
               "pinMemory": true, "timeoutSeconds": 120, "seed": 0, "startMethod": "spawn",
               "workerCommand": [], "pythonPool": true,
               "preloadModules": ["torch", "__main__"]},
    "restartPolicy": {"mode": "InPlace", "maxRestarts": 3, "backoffSeconds": 10,
                      "resetAfterSeconds": 600, "retryableExitCodes": [], "standby": true},
    "rendezvous": {"port": 29500},
    "shmSize": "8Gi",
    "runPolicy": {"suspend": false, "activeDeadlineSeconds": null,
                  "ttlSecondsAfterFinished": null, "cleanPodPolicy": "Running"},
    "stallPolicy": {"timeoutSeconds": "auto", "startupTimeoutSeconds": 0, "action": "Report",
                    "stragglerRatio": 1.5},
    "scheduling": {"gang": "none"}
  })");
  EXPECT_EQ(out["spec"], expected_spec) << out["spec"].dump(2);
}

TEST(TrainingJob, RoundTripThroughJson) {
  for (const char* file : {"minimal.yaml", "full.yaml"}) {
    SCOPED_TRACE(file);
    TrainingJob job = LoadOne(kData + file);
    job.status = {{"phase", "Running"}, {"restarts", 1}};
    json first = TrainingJobToJson(job);
    auto again = TrainingJobFromJson(first);
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(TrainingJobToJson(*again), first);
    EXPECT_EQ(again->status["phase"], "Running");
    EXPECT_EQ(again->name, job.name);
    EXPECT_EQ(again->namespace_, job.namespace_);
    EXPECT_EQ(again->spec.trainer.env.size(), job.spec.trainer.env.size());
    EXPECT_EQ(again->spec.shm_size_bytes, job.spec.shm_size_bytes);
    EXPECT_EQ(again->spec.loader.workers_per_rank, job.spec.loader.workers_per_rank);
    EXPECT_EQ(again->spec.loader.python_pool, job.spec.loader.python_pool);
    EXPECT_EQ(again->spec.loader.preload_modules, job.spec.loader.preload_modules);
  }
}

TEST(TrainingJob, FromJsonErrorsNameTheFieldPath) {
  json object = TrainingJobToJson(LoadOne(kData + "full.yaml"));
  object["spec"]["loader"]["prefetchFactor"] = 0;
  auto job = TrainingJobFromJson(object);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), "spec.loader.prefetchFactor: must be >= 1, got 0");

  object = TrainingJobToJson(LoadOne(kData + "full.yaml"));
  object["kind"] = "ConfigMap";
  EXPECT_EQ(TrainingJobFromJson(object).status().message(),
            "kind: must be \"TrainingJob\", got \"ConfigMap\"");

  object = TrainingJobToJson(LoadOne(kData + "full.yaml"));
  object["spec"]["template"]["spec"]["containers"][1]["env"][0]["value"] = 256;
  EXPECT_EQ(TrainingJobFromJson(object).status().message(),
            "spec.template.spec.containers[1].env[0].value: must be a string, got number 256");

  EXPECT_EQ(TrainingJobFromJson(json::array()).status().message(),
            "a TrainingJob must be an object with apiVersion: spawnpoint.dev/v1alpha1, kind: "
            "TrainingJob, metadata and spec; got a list");
}

TEST(TrainingJob, FromJsonTreatsNullAsOmitted) {
  json object = TrainingJobToJson(LoadOne(kData + "minimal.yaml"));
  object["spec"]["loader"] = nullptr;
  object["spec"]["nodes"] = nullptr;
  auto job = TrainingJobFromJson(object);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->spec.nodes, 1);
  EXPECT_EQ(job->spec.loader.prefetch_factor, 2);
}

TEST(TrainingJob, MultipleDocuments) {
  std::string stream =
      WithSpec("  nodes: 2\n") + "---\n# nothing here\n---\n" + WithSpec("  nodes: 3\n");
  auto jobs = ParseTrainingJobs(stream, "jobs.yaml");
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].spec.nodes, 2);
  EXPECT_EQ((*jobs)[0].source, "jobs.yaml (document 1)");
  EXPECT_EQ((*jobs)[1].spec.nodes, 3);
  EXPECT_EQ((*jobs)[1].source, "jobs.yaml (document 3)");
}

TEST(TrainingJob, SingleDocumentWithSeparatorsIsNamedByFileOnly) {
  auto jobs = ParseTrainingJobs("---\n" + WithSpec("") + "---\n", "job.yaml");
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().source, "job.yaml");
}

TEST(TrainingJob, ErrorsInLaterDocumentsPointAtTheirLine) {
  std::string stream = WithSpec("") + "---\n" + WithSpec("  nodes: -2\n");
  EXPECT_EQ(ParseError(stream), "job.yaml:22:10: spec.nodes: must be >= 1, got -2");
  stream = WithSpec("") + "---\napiVersion: v1\nkind: Service\nmetadata: {name: x}\n";
  EXPECT_EQ(ParseError(stream),
            "job.yaml:13:7: kind: document 2 is a \"Service\"; only kind \"TrainingJob\" "
            "(apiVersion spawnpoint.dev/v1alpha1) is allowed here");
}

TEST(TrainingJob, EmptyInputIsAnError) {
  const std::string expected =
      "job.yaml:1:1: no TrainingJob found: the input has no YAML documents; expected one or "
      "more documents with apiVersion: spawnpoint.dev/v1alpha1, kind: TrainingJob";
  EXPECT_EQ(ParseError(""), expected);
  EXPECT_EQ(ParseError("# just a comment\n\n"), expected);
  EXPECT_EQ(ParseError("---\n---\n"), expected);
}

TEST(TrainingJob, UnreadableFileIsNotFound) {
  auto jobs = LoadTrainingJobsFile("/nonexistent/job.yaml");
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(jobs.status().message(),
            "cannot read /nonexistent/job.yaml: No such file or directory");
  jobs = LoadTrainingJobsFile(kData);
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(jobs.status().message(), "cannot read " + kData + ": Is a directory");
}

TEST(TrainingJob, YamlSyntaxErrorsHaveYamlsPosition) {
  EXPECT_EQ(ParseError("apiVersion: spawnpoint.dev/v1alpha1\nkind: [TrainingJob\nspec: {}\n"),
            "job.yaml:3:5: invalid YAML: end of sequence flow not found");
  EXPECT_EQ(ParseError("spec:\n  nodes: 2\n   gpusPerNode: 4\n"),
            "job.yaml:3:15: invalid YAML: illegal map value");
}

struct BadCase {
  std::string spec;  // appended to kBase at line 11
  std::string message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << testing::PrintToString(c.spec); }

class BadSpec : public testing::TestWithParam<BadCase> {};

TEST_P(BadSpec, IsRejectedWithLocationAndMessage) {
  EXPECT_EQ(ParseError(WithSpec(GetParam().spec)), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    TrainingJob, BadSpec,
    testing::Values(
        // Types.
        BadCase{"  nodes: two\n",
                "job.yaml:11:10: spec.nodes: must be an integer, got string \"two\""},
        BadCase{"  nodes: \"2\"\n",
                "job.yaml:11:10: spec.nodes: must be an integer, got string \"2\""},
        BadCase{"  nodes: 2.5\n", "job.yaml:11:10: spec.nodes: must be an integer, got number 2.5"},
        BadCase{"  nodes: [2]\n", "job.yaml:11:10: spec.nodes: must be an integer, got a list"},
        BadCase{"  nodes: 99999999999\n",
                "job.yaml:11:10: spec.nodes: must be <= 2147483647, got 99999999999"},
        BadCase{"  loader:\n    pinMemory: maybe\n",
                "job.yaml:12:16: spec.loader.pinMemory: must be a boolean (true or false), got "
                "string \"maybe\""},
        BadCase{"  loader:\n    workerCommand: python worker.py\n",
                "job.yaml:12:20: spec.loader.workerCommand: must be a list of strings, got string "
                "\"python worker.py\""},
        BadCase{"  loader:\n    workerCommand: [python, 3]\n",
                "job.yaml:12:29: spec.loader.workerCommand[1]: must be a string, got number 3 "
                "(quote it to make it a string)"},
        BadCase{"  backend: 1\n",
                "job.yaml:11:12: spec.backend: must be one of auto, nccl, gloo; got number 1"},
        BadCase{"  gpuResource: 1\n",
                "job.yaml:11:16: spec.gpuResource: must be one of nvidia.com/gpu, amd.com/gpu; got "
                "number 1"},
        BadCase{"  loader: {startMethod: 0}\n",
                "job.yaml:11:25: spec.loader.startMethod: must be \"spawn\", got number 0"},
        BadCase{
            "  shmSize: true\n",
            "job.yaml:11:12: spec.shmSize: must be a quantity such as \"8Gi\", got boolean true"},
        BadCase{
            "  loader: 4\n",
            "job.yaml:11:11: spec.loader: must be an object (the loader settings), got number 4"},
        BadCase{"  loader:\n    pythonPool: \"false\"\n",
                "job.yaml:12:17: spec.loader.pythonPool: must be a boolean (true or false), got "
                "string \"false\""},
        BadCase{"  loader:\n    preloadModules: torch\n",
                "job.yaml:12:21: spec.loader.preloadModules: must be a list of at most 32 Python "
                "module names (e.g. [torch, numpy]); got string \"torch\""},
        BadCase{"  loader:\n    preloadModules: [torch, 3]\n",
                "job.yaml:12:29: spec.loader.preloadModules[1]: must be a Python module name (a "
                "string such as \"numpy\"), got number 3"},
        // Ranges.
        BadCase{"  nodes: 0\n", "job.yaml:11:10: spec.nodes: must be >= 1, got 0"},
        BadCase{"  gpusPerNode: -1\n", "job.yaml:11:16: spec.gpusPerNode: must be >= 0, got -1"},
        BadCase{"  procsPerNode: 0\n", "job.yaml:11:17: spec.procsPerNode: must be >= 1, got 0"},
        BadCase{"  loader: {prefetchFactor: 0}\n",
                "job.yaml:11:28: spec.loader.prefetchFactor: must be >= 1, got 0"},
        BadCase{"  loader:\n    workersPerRank: -1\n",
                "job.yaml:12:21: spec.loader.workersPerRank: must be >= 0, got -1"},
        BadCase{"  loader:\n    workersPerRank: lots\n",
                "job.yaml:12:21: spec.loader.workersPerRank: must be an integer >= 0 or \"auto\", "
                "got string \"lots\""},
        BadCase{"  loader:\n    workersPerRank: true\n",
                "job.yaml:12:21: spec.loader.workersPerRank: must be an integer >= 0 or \"auto\", "
                "got boolean true"},
        BadCase{"  loader:\n    timeoutSeconds: 0\n",
                "job.yaml:12:21: spec.loader.timeoutSeconds: must be >= 1, got 0"},
        BadCase{"  loader:\n    seed: -1\n",
                "job.yaml:12:11: spec.loader.seed: must be >= 0, got -1"},
        BadCase{"  loader:\n    seed: 1.5\n",
                "job.yaml:12:11: spec.loader.seed: must be an integer, got number 1.5"},
        BadCase{"  restartPolicy:\n    maxRestarts: -1\n",
                "job.yaml:12:18: spec.restartPolicy.maxRestarts: must be >= 0, got -1"},
        BadCase{"  restartPolicy:\n    backoffSeconds: -5\n",
                "job.yaml:12:21: spec.restartPolicy.backoffSeconds: must be >= 0, got -5"},
        BadCase{"  restartPolicy:\n    resetAfterSeconds: 0\n",
                "job.yaml:12:24: spec.restartPolicy.resetAfterSeconds: must be >= 1, got 0"},
        BadCase{"  restartPolicy:\n    retryableExitCodes: [137, 0]\n",
                "job.yaml:12:31: spec.restartPolicy.retryableExitCodes[1]: must be between 1 and "
                "255, got 0"},
        BadCase{"  restartPolicy:\n    retryOn: [Killed, Kiled]\n",
                "job.yaml:12:23: spec.restartPolicy.retryOn[1]: must be one of UserError, "
                "OOMKilled, ShmExhausted, Killed, Terminated, Crashed, Stalled, GpuOutOfMemory, "
                "CollectiveTimeout, CollectiveError, LoaderWorkerKilled, ImportError, PortInUse, "
                "GangStartTimeout, Evicted, Preempted, NodeLost; got \"Kiled\" (did you mean "
                "\"Killed\"?)"},
        BadCase{"  restartPolicy:\n    mode: inplace\n",
                "job.yaml:12:11: spec.restartPolicy.mode: must be one of InPlace, Recreate; got "
                "\"inplace\" (did you mean \"InPlace\"?)"},
        BadCase{"  restartPolicy:\n    mode: Restart\n",
                "job.yaml:12:11: spec.restartPolicy.mode: must be one of InPlace, Recreate; got "
                "\"Restart\""},
        BadCase{"  restartPolicy:\n    mode: 1\n",
                "job.yaml:12:11: spec.restartPolicy.mode: must be one of InPlace, Recreate; got "
                "number 1"},
        BadCase{"  restartPolicy:\n    retryOn: [0]\n",
                "job.yaml:12:15: spec.restartPolicy.retryOn[0]: must be between 1 and 255, got 0"},
        BadCase{"  restartPolicy:\n    retryOn: Killed\n",
                "job.yaml:12:14: spec.restartPolicy.retryOn: must be a list of exit codes (1-255) "
                "and failure causes, got string \"Killed\""},
        BadCase{"  restartPolicy:\n    retryableExitCodes: 137\n",
                "job.yaml:12:25: spec.restartPolicy.retryableExitCodes: must be a list of exit "
                "codes (1-255), got number 137"},
        BadCase{"  rendezvous: {port: 70000}\n",
                "job.yaml:11:22: spec.rendezvous.port: must be between 1 and 65535, got 70000"},
        BadCase{"  rendezvous: {port: 0}\n",
                "job.yaml:11:22: spec.rendezvous.port: must be between 1 and 65535, got 0"},
        BadCase{"  runPolicy:\n    activeDeadlineSeconds: 0\n",
                "job.yaml:12:28: spec.runPolicy.activeDeadlineSeconds: must be >= 1, got 0"},
        BadCase{"  runPolicy:\n    ttlSecondsAfterFinished: -1\n",
                "job.yaml:12:30: spec.runPolicy.ttlSecondsAfterFinished: must be >= 0, got -1"},
        BadCase{"  stallPolicy:\n    timeoutSeconds: 0\n",
                "job.yaml:12:21: spec.stallPolicy.timeoutSeconds: must be >= 1, got 0"},
        BadCase{"  stallPolicy:\n    timeoutSeconds: soon\n",
                "job.yaml:12:21: spec.stallPolicy.timeoutSeconds: must be an integer >= 1 or "
                "\"auto\", got string \"soon\""},
        BadCase{"  stallPolicy:\n    action: Kill\n",
                "job.yaml:12:13: spec.stallPolicy.action: must be one of Report, Restart, Fail; "
                "got \"Kill\""},
        BadCase{"  stallPolicy:\n    stragglerRatio: 1\n",
                "job.yaml:12:21: spec.stallPolicy.stragglerRatio: must be a number > 1 and <= 100 "
                "(a rank this many times slower than the job's median straggles), got number 1"},
        BadCase{"  stallPolicy:\n    timeout: 5\n",
                "job.yaml:12:5: spec.stallPolicy.timeout: unknown field (did you mean "
                "\"timeoutSeconds\"?); allowed: timeoutSeconds, startupTimeoutSeconds, action, "
                "stragglerRatio"},
        BadCase{"  runPolicy:\n    suspend: 1\n",
                "job.yaml:12:14: spec.runPolicy.suspend: must be a boolean (true or false), got "
                "number 1"},
        BadCase{"  nodes: 10000\n  gpusPerNode: 8\n",
                "job.yaml:11:10: spec.nodes: the job's GPUs (nodes x gpusPerNode = 10000 x 8) "
                "must be at most 32768"},
        BadCase{"  nodes: 65536\n  procsPerNode: 65536\n",
                "job.yaml:11:10: spec.nodes: the world size (nodes x ranks per node = 65536 x "
                "65536) must be <= 2147483647"},
        // Enumerations.
        BadCase{"  gpuResource: nvidia.com/GPU\n",
                "job.yaml:11:16: spec.gpuResource: must be one of nvidia.com/gpu, amd.com/gpu; got "
                "\"nvidia.com/GPU\" (did you mean \"nvidia.com/gpu\"?)"},
        BadCase{"  gpuResource: intel.com/gpu\n",
                "job.yaml:11:16: spec.gpuResource: must be one of nvidia.com/gpu, amd.com/gpu; got "
                "\"intel.com/gpu\""},
        BadCase{"  gpuAssignment: Exclusive\n",
                "job.yaml:11:18: spec.gpuAssignment: must be one of shared, exclusive; got "
                "\"Exclusive\" (did you mean \"exclusive\"?)"},
        BadCase{"  backend: mpi\n",
                "job.yaml:11:12: spec.backend: must be one of auto, nccl, gloo; got \"mpi\""},
        BadCase{"  backend: nccl\n",
                "job.yaml:11:12: spec.backend: \"nccl\" needs GPUs but spec.gpusPerNode is 0; use "
                "\"gloo\" or \"auto\" for CPU ranks, or set gpusPerNode >= 1"},
        BadCase{"  runPolicy: {cleanPodPolicy: none}\n",
                "job.yaml:11:31: spec.runPolicy.cleanPodPolicy: must be one of None, Running, All; "
                "got \"none\" (did you mean \"None\"?)"},
        BadCase{"  loader:\n    startMethod: fork\n",
                "job.yaml:12:18: spec.loader.startMethod: \"fork\" is not allowed: forking a "
                "process after it initialised CUDA/ROCm corrupts the GPU context (and OpenMP "
                "thread pools); use \"spawn\""},
        BadCase{"  loader:\n    startMethod: forkserver\n",
                "job.yaml:12:18: spec.loader.startMethod: \"forkserver\" is not allowed: the agent "
                "starts every worker as a fresh process; use \"spawn\""},
        BadCase{"  loader:\n    startMethod: thread\n",
                "job.yaml:12:18: spec.loader.startMethod: must be \"spawn\" (the only start "
                "method), got \"thread\""},
        // Quantities.
        BadCase{
            "  shmSize: 8GB\n",
            "job.yaml:11:12: spec.shmSize: invalid quantity \"8GB\": unknown suffix \"GB\" (did "
            "you mean \"8Gi\" (powers of 1024) or \"8G\" (powers of 1000)?); expected a "
            "non-negative number with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei (powers of "
            "1024) or k, M, G, T, P, E (powers of 1000), e.g. \"8Gi\""},
        BadCase{"  shmSize: 0\n",
                "job.yaml:11:12: spec.shmSize: must be > 0 (a size for /dev/shm such as \"8Gi\"), "
                "got \"0\""},
        BadCase{"  shmSize: -1Gi\n",
                "job.yaml:11:12: spec.shmSize: invalid quantity \"-1Gi\": must not be negative"},
        // Unknown fields: reported at the key, with a suggestion when one is close.
        BadCase{"  loader:\n    prefetch: 4\n",
                "job.yaml:12:5: spec.loader.prefetch: unknown field (did you mean "
                "\"prefetchFactor\"?); allowed: workersPerRank, prefetchFactor, persistentWorkers, "
                "pinMemory, timeoutSeconds, seed, startMethod, workerCommand, pythonPool, "
                "preloadModules"},
        BadCase{"  loader:\n    num_workers: 4\n",
                "job.yaml:12:5: spec.loader.num_workers: unknown field; allowed: workersPerRank, "
                "prefetchFactor, persistentWorkers, pinMemory, timeoutSeconds, seed, startMethod, "
                "workerCommand, pythonPool, preloadModules"},
        BadCase{
            "  node: 2\n",
            "job.yaml:11:3: spec.node: unknown field (did you mean \"nodes\"?); allowed: nodes, "
            "gpusPerNode, procsPerNode, gpuResource, gpuAssignment, backend, template, loader, "
            "restartPolicy, rendezvous, shmSize, runPolicy, stallPolicy, "
            "scheduling"},
        BadCase{"  port: 29501\n",
                "job.yaml:11:3: spec.port: unknown field (did you mean spec.rendezvous.port?); "
                "allowed: nodes, gpusPerNode, procsPerNode, gpuResource, gpuAssignment, backend, "
                "template, loader, restartPolicy, rendezvous, shmSize, runPolicy, stallPolicy, "
                "scheduling"},
        BadCase{"  restartPolicy:\n    max_restarts: 1\n",
                "job.yaml:12:5: spec.restartPolicy.max_restarts: unknown field (did you mean "
                "\"maxRestarts\"?); allowed: mode, maxRestarts, backoffSeconds, "
                "resetAfterSeconds, retryableExitCodes, retryOn, standby"},
        BadCase{"  rendezvous:\n    host: 10.0.0.1\n",
                "job.yaml:12:5: spec.rendezvous.host: unknown field; allowed: port"},
        BadCase{"  runPolicy:\n    backoffLimit: 3\n",
                "job.yaml:12:5: spec.runPolicy.backoffLimit: unknown field; allowed: suspend, "
                "activeDeadlineSeconds, ttlSecondsAfterFinished, cleanPodPolicy"},
        BadCase{"  nodes: 1\n  nodes: 2\n",
                "job.yaml:12:3: spec.nodes: duplicate key; each field may appear once"},
        // spec.scheduling (issue 40).
        BadCase{"  scheduling:\n    gang: Volcano\n",
                "job.yaml:12:11: spec.scheduling.gang: must be one of none, volcano, kueue; got "
                "\"Volcano\" (did you mean \"volcano\"?)"},
        BadCase{"  scheduling:\n    gang: kueue\n",
                "job.yaml:12:11: spec.scheduling.gang: \"kueue\" needs a LocalQueue of the job's "
                "namespace: set spec.scheduling.queue, or the label kueue.x-k8s.io/queue-name on "
                "metadata.labels"},
        BadCase{"  scheduling:\n    queue: team-a\n",
                "job.yaml:12:12: spec.scheduling.queue: is used only by a gang scheduler, and "
                "spec.scheduling.gang is \"none\"; set gang to \"volcano\" or \"kueue\", or "
                "remove the queue"},
        BadCase{"  scheduling:\n    gang: volcano\n    queue: Team_A\n",
                "job.yaml:13:12: spec.scheduling.queue: must be the name of a Volcano Queue: "
                "lowercase letters, digits, '-' and '.', starting and ending with a letter or "
                "digit, at most 253 characters; got \"Team_A\""},
        BadCase{"  scheduling:\n    gang: kueue\n    queue: " + std::string(64, 'q') + "\n",
                "job.yaml:13:12: spec.scheduling.queue: must be the name of a LocalQueue: "
                "lowercase letters, digits, '-' and '.', starting and ending with a letter or "
                "digit, at most 63 characters; got \"" +
                    std::string(64, 'q') + "\""},
        BadCase{"  scheduling:\n    gang: volcano\n    priorityClassName: High\n",
                "job.yaml:13:24: spec.scheduling.priorityClassName: must be the name of a "
                "PriorityClass: lowercase letters, digits, '-' and '.', starting and ending with "
                "a letter or digit, at most 253 characters; got \"High\""},
        BadCase{"  scheduling:\n    queueName: a\n",
                "job.yaml:12:5: spec.scheduling.queueName: unknown field; allowed: gang, queue, "
                "priorityClassName"},
        BadCase{"  scheduling: volcano\n",
                "job.yaml:11:15: spec.scheduling: must be an object (the gang scheduling "
                "settings), got string \"volcano\""}));

TEST(TrainingJob, MetadataErrors) {
  auto with_metadata = [](const std::string& metadata) {
    return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n" + metadata +
           "spec:\n  template: {spec: {containers: [{name: t, command: [sh]}]}}\n";
  };
  const std::string rule =
      "lowercase letters, digits and '-', starting with a letter and ending with a letter or "
      "digit, at most 52 characters (e.g. \"resnet-ddp\")";
  EXPECT_EQ(ParseError(with_metadata("  namespace: ml\n")),
            "job.yaml:3:1: metadata.name: required; " + rule);
  EXPECT_EQ(ParseError(with_metadata("  name: 7up\n")),
            "job.yaml:4:9: metadata.name: must consist of " + rule + ", got \"7up\"");
  EXPECT_EQ(ParseError(with_metadata("  name: job-\n")),
            "job.yaml:4:9: metadata.name: must consist of " + rule + ", got \"job-\"");
  EXPECT_EQ(ParseError(with_metadata("  name: 12\n")),
            "job.yaml:4:9: metadata.name: must be a string of " + rule +
                "; got number 12 (quote it to make it a string)");
  EXPECT_EQ(ParseError(with_metadata("  name: " + std::string(53, 'a') + "\n")),
            "job.yaml:4:9: metadata.name: must be at most 52 characters (pod names add "
            "\"-node-NNN\" and must fit in 63), got 53");
  EXPECT_TRUE(ParseTrainingJobs(with_metadata("  name: " + std::string(52, 'a') + "\n"), "j").ok());
  EXPECT_EQ(ParseError(with_metadata("  name: job\n  namespace: ML\n")),
            "job.yaml:5:14: metadata.namespace: must be a DNS label: lowercase letters, digits and "
            "'-', starting and ending with a letter or digit, at most 63 characters; got \"ML\"");
  EXPECT_EQ(ParseError("apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nspec: {}\n"),
            "job.yaml:1:1: metadata: required; ObjectMeta with at least a name");
  EXPECT_EQ(ParseError("apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n"),
            "job.yaml:3:1: metadata: required; ObjectMeta with at least a name");
  // Anything else in metadata (labels, annotations, uid, ...) is Kubernetes' business.
  EXPECT_TRUE(
      ParseTrainingJobs(with_metadata("  name: job\n  uid: 1\n  labels: {a: b}\n"), "j").ok());
}

TEST(TrainingJob, HeaderErrors) {
  EXPECT_EQ(ParseError("kind: TrainingJob\nmetadata: {name: a}\n"),
            "job.yaml:1:1: apiVersion: required; must be \"spawnpoint.dev/v1alpha1\"");
  EXPECT_EQ(ParseError("apiVersion: spawnpoint.dev/v1alpha1\nmetadata: {name: a}\n"),
            "job.yaml:1:1: kind: required; must be \"TrainingJob\"");
  EXPECT_EQ(ParseError("apiVersion: spawnpoint.dev/v1beta1\nkind: TrainingJob\n"),
            "job.yaml:1:13: apiVersion: must be \"spawnpoint.dev/v1alpha1\", got "
            "\"spawnpoint.dev/v1beta1\"");
  EXPECT_EQ(ParseError("apiVersion: apps/v1\nkind: Deployment\n"),
            "job.yaml:2:7: kind: document 1 is a \"Deployment\"; only kind \"TrainingJob\" "
            "(apiVersion spawnpoint.dev/v1alpha1) is allowed here");
  EXPECT_EQ(ParseError(WithSpec("") + "statuss: {}\n"),
            "job.yaml:11:1: statuss: unknown field (did you mean \"status\"?); allowed: "
            "apiVersion, kind, metadata, spec, status");
  EXPECT_EQ(ParseError(WithSpec("") + "loader: {}\n"),
            "job.yaml:11:1: loader: unknown field (did you mean spec.loader?); allowed: "
            "apiVersion, kind, metadata, spec, status");
  EXPECT_EQ(ParseError("- apiVersion: spawnpoint.dev/v1alpha1\n"),
            "job.yaml:1:1: a TrainingJob must be an object with apiVersion: "
            "spawnpoint.dev/v1alpha1, kind: TrainingJob, metadata and spec; got a list");
}

TEST(TrainingJob, TemplateErrors) {
  auto with_template = [](const std::string& tmpl) {
    return "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: job}\nspec:\n"
           "  nodes: 1\n" +
           tmpl;
  };
  EXPECT_EQ(ParseError(with_template("")),
            "job.yaml:4:1: spec.template: required; a PodTemplateSpec whose spec.containers "
            "holds the trainer container");
  EXPECT_EQ(ParseError(with_template("  template:\n")),
            "job.yaml:6:3: spec.template: required; a PodTemplateSpec whose spec.containers "
            "holds the trainer container");
  EXPECT_EQ(ParseError(with_template("  template: pod.yaml\n")),
            "job.yaml:6:13: spec.template: must be an object (a PodTemplateSpec whose "
            "spec.containers holds the trainer container), got string \"pod.yaml\"");
  EXPECT_EQ(ParseError(with_template("  template:\n    metadata: {}\n")),
            "job.yaml:6:3: spec.template.spec: required; a PodSpec with the trainer in containers");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      hostNetwork: true\n")),
            "job.yaml:7:5: spec.template.spec.containers: required; a list of containers; the one "
            "named \"trainer\" (or the first) runs");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers: []\n")),
            "job.yaml:8:19: spec.template.spec.containers: must hold at least one container (the "
            "one named \"trainer\", or the first, runs the job)");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers: [trainer]\n")),
            "job.yaml:8:20: spec.template.spec.containers[0]: must be an object (a Container), "
            "got string \"trainer\"");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers:\n"
                                     "        - name: trainer\n          image: x\n")),
            "job.yaml:9:11: spec.template.spec.containers[0]: the trainer container needs a "
            "command or args (command + args is what every rank runs)");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers:\n"
                                     "        - name: trainer\n          command: [\"\", x]\n")),
            "job.yaml:10:21: spec.template.spec.containers[0].command[0]: must not be empty: it "
            "is the program every rank runs");
  EXPECT_EQ(
      ParseError(with_template("  template:\n    spec:\n      containers:\n"
                               "        - name: trainer\n          command: python train.py\n")),
      "job.yaml:10:20: spec.template.spec.containers[0].command: must be a list of strings, "
      "got string \"python train.py\"");
  // The trainer is the container named "trainer"; the others are not checked.
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers:\n"
                                     "        - name: log-shipper\n"
                                     "        - name: trainer\n          env: [{value: x}]\n"
                                     "          args: [train.py]\n")),
            "job.yaml:11:17: spec.template.spec.containers[1].env[0].name: required");
  EXPECT_EQ(ParseError(with_template(
                "  template:\n    spec:\n      containers:\n"
                "        - name: trainer\n          args: [train.py]\n"
                "          env:\n            - name: FLAG\n              value: on\n")),
            "job.yaml:13:22: spec.template.spec.containers[0].env[0].value: must be a string, got "
            "boolean true (quote it to make it a string)");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers:\n"
                                     "        - name: trainer\n          args: [train.py]\n"
                                     "          env: {A: b}\n")),
            "job.yaml:11:16: spec.template.spec.containers[0].env: must be a list, got an "
            "object");
  EXPECT_EQ(ParseError(with_template("  template:\n    spec:\n      containers:\n"
                                     "        - name: trainer\n          args: [train.py]\n"
                                     "          image: 2.1\n")),
            "job.yaml:11:18: spec.template.spec.containers[0].image: must be a string, got number "
            "2.1 (quote it to make it a string)");
}

TEST(TrainingJob, FirstContainerRunsWhenNoneIsNamedTrainer) {
  TrainingJob job = ParseOne(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: job}\nspec:\n"
      "  template:\n    spec:\n      containers:\n"
      "        - {name: main, args: [train.py], env: [{name: A, value: '1'}]}\n"
      "        - {name: other, command: [sleep]}\n");
  EXPECT_EQ(job.spec.trainer.name, "main");
  EXPECT_TRUE(job.spec.trainer.command.empty());
  EXPECT_EQ(job.spec.trainer.args, std::vector<std::string>{"train.py"});
  ASSERT_EQ(job.spec.trainer.env.size(), 1u);
  EXPECT_EQ(job.spec.trainer.env[0].value, "1");
}

TEST(TrainingJob, PlainScalarsResolveAsKubectlDoes) {
  TrainingJob job = ParseOne(WithSpec(
      "  nodes: 0x2\n  gpusPerNode: 2.0\n  runPolicy:\n    suspend: yes\n"
      "    activeDeadlineSeconds: null\n    ttlSecondsAfterFinished: ~\n"
      "  loader:\n    seed: 18446744073709551615\n    workersPerRank: 0\n"
      "    persistentWorkers: off\n  restartPolicy:\n    retryableExitCodes: [0o177, 1_0]\n"
      "  shmSize: 1000000\n"));
  EXPECT_EQ(job.spec.nodes, 2);
  EXPECT_EQ(job.spec.gpus_per_node, 2);
  EXPECT_TRUE(job.spec.run_policy.suspend);
  EXPECT_EQ(job.spec.run_policy.active_deadline_seconds, std::nullopt);
  EXPECT_EQ(job.spec.run_policy.ttl_seconds_after_finished, std::nullopt);
  EXPECT_EQ(job.spec.loader.seed, 18446744073709551615u);
  EXPECT_EQ(job.spec.loader.workers_per_rank, 0);
  EXPECT_FALSE(job.spec.loader.persistent_workers);
  EXPECT_EQ(job.spec.restart_policy.retryable_exit_codes, (std::vector<int>{127, 10}));
  EXPECT_EQ(job.spec.shm_size, "1000000");
  EXPECT_EQ(job.spec.shm_size_bytes, 1000000);

  // Quoted and block scalars stay strings, whatever they look like.
  job = ParseOne(
      "apiVersion: spawnpoint.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: job}\nspec:\n"
      "  template:\n    spec:\n      containers:\n        - name: t\n          args:\n            "
      "- '1'\n"
      "            - \"true\"\n            - !!str 3\n            - |\n              multi\n"
      "              line\n          env:\n"
      "            - {name: A, value: \"null\"}\n            - {name: B, value: '0644'}\n");
  EXPECT_EQ(job.spec.trainer.args, (std::vector<std::string>{"1", "true", "3", "multi\nline\n"}));
  ASSERT_EQ(job.spec.trainer.env.size(), 2u);
  EXPECT_EQ(job.spec.trainer.env[0].value, "null");
  EXPECT_EQ(job.spec.trainer.env[1].value, "0644");
  // Octal as in YAML 1.1, like kubectl: defaultMode: 0644 is 420.
  EXPECT_EQ(ParseOne(WithSpec("") + "status: {mode: 0644, f: 1.5e3, s: 1.2.3, t: True}\n").status,
            json::parse(R"({"mode": 420, "f": 1500.0, "s": "1.2.3", "t": true})"));
  EXPECT_EQ(ParseError(WithSpec("") + "status: {x: .inf}\n"),
            "job.yaml:11:13: status.x: \".inf\" is a number JSON cannot represent (infinite or "
            "NaN); quote it if you mean a string");
}

// restartPolicy.retryOn: causes and exit codes, kept apart, and back the way they came.
TEST(TrainingJob, RetryOnTakesCausesAndExitCodes) {
  TrainingJob job = ParseOne(
      WithSpec("  restartPolicy:\n    retryOn: [Killed, OOMKilled, 3, CollectiveTimeout]\n"));
  const RestartPolicy& p = job.spec.restart_policy;
  EXPECT_EQ(p.retry_on_causes,
            (std::vector<std::string>{"Killed", "OOMKilled", "CollectiveTimeout"}));
  EXPECT_EQ(p.retry_on_exit_codes, (std::vector<int>{3}));
  json out = TrainingJobToJson(job);
  EXPECT_EQ(out["spec"]["restartPolicy"]["retryOn"],
            json::parse(R"([3, "Killed", "OOMKilled", "CollectiveTimeout"])"));
  auto again = TrainingJobFromJson(out);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->spec.restart_policy.retry_on_causes, p.retry_on_causes);
  EXPECT_EQ(again->spec.restart_policy.retry_on_exit_codes, p.retry_on_exit_codes);
  // Absent: nothing written, the default rule.
  EXPECT_FALSE(TrainingJobToJson(ParseOne(kBase))["spec"]["restartPolicy"].contains("retryOn"));
}

// restartPolicy.mode: InPlace unless Recreate is asked for, and back the way it came.
TEST(TrainingJob, RestartModeDefaultsToInPlace) {
  EXPECT_EQ(ParseOne(kBase).spec.restart_policy.mode, RestartMode::kInPlace);
  TrainingJob job = ParseOne(WithSpec("  restartPolicy:\n    mode: Recreate\n"));
  EXPECT_EQ(job.spec.restart_policy.mode, RestartMode::kRecreate);
  json out = TrainingJobToJson(job);
  EXPECT_EQ(out["spec"]["restartPolicy"]["mode"], "Recreate");
  auto again = TrainingJobFromJson(out);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->spec.restart_policy.mode, RestartMode::kRecreate);
  EXPECT_STREQ(RestartModeName(RestartMode::kInPlace), "InPlace");
}

TEST(TrainingJob, WorkersPerRankAuto) {
  EXPECT_EQ(ParseOne(WithSpec("  loader: {workersPerRank: auto}\n")).spec.loader.workers_per_rank,
            std::nullopt);
  EXPECT_EQ(ParseOne(WithSpec("  loader: {workersPerRank: 8}\n")).spec.loader.workers_per_rank, 8);
  // An empty section means "all defaults".
  EXPECT_EQ(ParseOne(WithSpec("  loader:\n")).spec.loader.prefetch_factor, 2);
}

TEST(TrainingJob, PythonPoolAndPreloadModules) {
  LoaderSpec loader = ParseOne(WithSpec("  loader:\n    pythonPool: false\n"
                                        "    preloadModules: [numpy, torchvision.transforms, "
                                        "_private.mod_2, PIL.Image]\n"))
                          .spec.loader;
  EXPECT_FALSE(loader.python_pool);
  EXPECT_EQ(loader.preload_modules, (std::vector<std::string>{"numpy", "torchvision.transforms",
                                                              "_private.mod_2", "PIL.Image"}));
  // An empty list preloads nothing; null (or absent) is the default.
  EXPECT_TRUE(
      ParseOne(WithSpec("  loader: {preloadModules: []}\n")).spec.loader.preload_modules.empty());
  EXPECT_EQ(ParseOne(WithSpec("  loader: {preloadModules: null}\n")).spec.loader.preload_modules,
            (std::vector<std::string>{"torch", "__main__"}));
  EXPECT_TRUE(ParseOne(WithSpec("  loader: {pythonPool: yes}\n")).spec.loader.python_pool);

  const std::string rule =
      "must be a Python module name: identifiers (letters, digits and '_', not starting with a "
      "digit) separated by '.', such as \"torch\" or \"torchvision.transforms\"; got ";
  for (const std::string bad : {"torch.", ".torch", "torch..nn", "1st", "torch.2d", "my-module",
                                "torch nn", "caf\xc3\xa9", "torch/nn"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(ParseError(WithSpec("  loader:\n    preloadModules: [numpy, \"" + bad + "\"]\n")),
              "job.yaml:12:29: spec.loader.preloadModules[1]: " + rule + "\"" + bad + "\"");
  }
  EXPECT_EQ(ParseError(WithSpec("  loader:\n    preloadModules: ['']\n")),
            "job.yaml:12:22: spec.loader.preloadModules[0]: " + rule + "\"\"");
  EXPECT_EQ(ParseError(WithSpec("  loader:\n    preloadModules: [torch, numpy, torch]\n")),
            "job.yaml:12:36: spec.loader.preloadModules[2]: \"torch\" is listed twice (also at "
            "index 0); each module may appear once");

  std::string modules;
  for (int i = 0; i < 32; ++i) modules += (i ? ", m" : "m") + std::to_string(i);
  EXPECT_EQ(ParseOne(WithSpec("  loader:\n    preloadModules: [" + modules + "]\n"))
                .spec.loader.preload_modules.size(),
            32u);
  EXPECT_EQ(ParseError(WithSpec("  loader:\n    preloadModules: [" + modules + ", m32]\n")),
            "job.yaml:12:21: spec.loader.preloadModules: must hold at most 32 modules, got 33");

  // The same rules for an API object, by field path.
  json object = TrainingJobToJson(LoadOne(kData + "full.yaml"));
  object["spec"]["loader"]["preloadModules"] = {"numpy", "numpy"};
  EXPECT_EQ(TrainingJobFromJson(object).status().message(),
            "spec.loader.preloadModules[1]: \"numpy\" is listed twice (also at index 0); each "
            "module may appear once");
  object["spec"]["loader"]["preloadModules"] = {"numpy", "torch.utils..data"};
  EXPECT_EQ(TrainingJobFromJson(object).status().message(),
            "spec.loader.preloadModules[1]: " + rule + "\"torch.utils..data\"");
  object["spec"]["loader"]["preloadModules"] = nullptr;
  object["spec"]["loader"]["pythonPool"] = nullptr;
  auto defaulted = TrainingJobFromJson(object);
  ASSERT_TRUE(defaulted.ok()) << defaulted.status().message();
  EXPECT_TRUE(defaulted->spec.loader.python_pool);
  EXPECT_EQ(defaulted->spec.loader.preload_modules,
            (std::vector<std::string>{"torch", "__main__"}));
}

// spec.scheduling (issue 40): the gang scheduler, its queue and the pods' priority, defaulted;
// the Kueue label on the job is honoured as Kueue users write it.
std::string WithLabels(const std::string& labels, const std::string& spec) {
  std::string yaml = WithSpec(spec);
  yaml.replace(yaml.find("  name: job\n"), 12, "  name: job\n  labels:\n" + labels);
  return yaml;
}

TEST(TrainingJob, SchedulingDefaultsAndQueues) {
  EXPECT_EQ(ParseOne(WithSpec("")).spec.scheduling.gang, GangScheduler::kNone);
  EXPECT_EQ(ParseOne(WithSpec("")).spec.scheduling.queue, "");

  TrainingJob volcano = ParseOne(WithSpec("  scheduling: {gang: volcano}\n"));
  EXPECT_EQ(volcano.spec.scheduling.gang, GangScheduler::kVolcano);
  EXPECT_EQ(volcano.spec.scheduling.queue, "default");  // Volcano's default queue
  EXPECT_EQ(TrainingJobToJson(volcano)["spec"]["scheduling"],
            json({{"gang", "volcano"}, {"queue", "default"}}));

  TrainingJob named = ParseOne(WithSpec(
      "  scheduling: {gang: volcano, queue: research, priorityClassName: high.priority}\n"));
  EXPECT_EQ(named.spec.scheduling.queue, "research");
  EXPECT_EQ(named.spec.scheduling.priority_class_name, "high.priority");

  TrainingJob kueue = ParseOne(WithSpec("  scheduling: {gang: kueue, queue: team-a}\n"));
  EXPECT_EQ(kueue.spec.scheduling.gang, GangScheduler::kKueue);
  EXPECT_EQ(kueue.spec.scheduling.queue, "team-a");

  // The label alone: a Kueue workload of that LocalQueue, as any Kueue user writes it.
  TrainingJob labelled = ParseOne(WithLabels("    kueue.x-k8s.io/queue-name: team-b\n", ""));
  EXPECT_EQ(labelled.spec.scheduling.gang, GangScheduler::kKueue);
  EXPECT_EQ(labelled.spec.scheduling.queue, "team-b");
  // ... with gang kueue, or the same queue in both places.
  EXPECT_EQ(ParseOne(WithLabels("    kueue.x-k8s.io/queue-name: team-b\n",
                                "  scheduling: {gang: kueue}\n"))
                .spec.scheduling.queue,
            "team-b");
  EXPECT_EQ(ParseOne(WithLabels("    kueue.x-k8s.io/queue-name: team-b\n",
                                "  scheduling: {queue: team-b}\n"))
                .spec.scheduling.gang,
            GangScheduler::kKueue);

  // What the operator hands the agent (metadata without labels) still parses, and round trips.
  for (const TrainingJob* job : {&volcano, &named, &kueue, &labelled}) {
    json out = TrainingJobToJson(*job);
    out["metadata"] = {{"name", "job"}};
    auto again = TrainingJobFromJson(out);
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(again->spec.scheduling.gang, job->spec.scheduling.gang);
    EXPECT_EQ(again->spec.scheduling.queue, job->spec.scheduling.queue);
    EXPECT_EQ(again->spec.scheduling.priority_class_name, job->spec.scheduling.priority_class_name);
  }
}

TEST(TrainingJob, SchedulingErrorsNameTheLabelOrTheField) {
  EXPECT_EQ(ParseError(WithLabels("    kueue.x-k8s.io/queue-name: team-b\n",
                                  "  scheduling: {gang: volcano}\n")),
            "job.yaml:6:32: metadata.labels.kueue.x-k8s.io/queue-name: the label "
            "kueue.x-k8s.io/queue-name queues the job in Kueue, but spec.scheduling.gang is "
            "\"volcano\"; remove the label, or set gang to \"kueue\"");
  EXPECT_EQ(ParseError(WithLabels("    kueue.x-k8s.io/queue-name: team-b\n",
                                  "  scheduling:\n    gang: kueue\n    queue: team-c\n")),
            "job.yaml:15:12: spec.scheduling.queue: \"team-c\" differs from the label "
            "kueue.x-k8s.io/queue-name \"team-b\" on the job; give the LocalQueue once, or the "
            "same name in both");
  EXPECT_EQ(ParseError(WithLabels("    kueue.x-k8s.io/queue-name: Team_B\n", "")),
            "job.yaml:6:32: metadata.labels.kueue.x-k8s.io/queue-name: must be the name of a "
            "LocalQueue: lowercase letters, digits, '-' and '.', starting and ending with a "
            "letter or digit, at most 63 characters; got \"Team_B\"");
  // From an API object (the operator's view): the field path alone.
  json object = TrainingJobToJson(ParseOne(WithSpec("")));
  object["spec"]["scheduling"] = {{"gang", "kueue"}};
  auto job = TrainingJobFromJson(object);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "spec.scheduling.gang: \"kueue\" needs a LocalQueue of the job's namespace: set "
            "spec.scheduling.queue, or the label kueue.x-k8s.io/queue-name on metadata.labels");
}

TEST(TrainingJob, JsonTextIsYaml) {
  std::string text =
      R"({"apiVersion": "spawnpoint.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},)"
      "\n"
      R"( "spec": {"nodes": 2, "template": {"spec": {"containers": [{"name": "t", "command": ["a"]}]}}}})";
  EXPECT_EQ(ParseOne(text).spec.nodes, 2);
  std::string bad = text;
  bad.replace(bad.find("\"nodes\": 2"), 10, "\"nodes\": \"2\"");
  EXPECT_EQ(ParseError(bad), "job.yaml:2:20: spec.nodes: must be an integer, got string \"2\"");
}

TEST(TrainingJob, InvalidUtf8IsReportedNotThrown) {
  std::string message = ParseError(WithSpec("  nodes: \"\xff\xfe\"\n"));
  EXPECT_EQ(message.rfind("job.yaml:11:10: spec.nodes: must be an integer, got string \"", 0), 0u)
      << message;
  TrainingJob job = ParseOne(WithSpec("") + "status: {note: \"caf\xe9\"}\n");
  EXPECT_NO_THROW(TrainingJobToJson(job).dump(-1, ' ', false, json::error_handler_t::replace));
}

// Found by tests/fuzz (training_job, #15): the schema's unique-key check of a list (here
// containers, keyed by name) dumped keys that are not UTF-8, and the parser threw.
TEST(TrainingJob, InvalidUtf8InAListKeyIsCheckedNotThrown) {
  const std::string twice = WithSpec("") +
                            "        - name: \"caf\xe9\"\n"
                            "        - name: \"caf\xe9\"\n";
  std::string message;
  EXPECT_NO_THROW(message = ParseError(twice));
  EXPECT_NE(message.find("duplicate entry (name \"caf\xEF\xBF\xBD\")"), std::string::npos)
      << message;
  const std::string different = WithSpec("") +
                                "        - name: \"caf\xe9\"\n"
                                "        - name: \"caf\xe8\"\n";
  EXPECT_NO_THROW(message = ParseError(different));
  EXPECT_EQ(message.find("duplicate entry"), std::string::npos) << message;
}

TEST(TrainingJob, MisplacedFieldIsPointedToItsPlace) {
  // "suspend" is spelled right but belongs under runPolicy.
  EXPECT_EQ(ParseError(WithSpec("  suspend: true\n")),
            "job.yaml:11:3: spec.suspend: unknown field (did you mean spec.runPolicy.suspend?); "
            "allowed: nodes, gpusPerNode, procsPerNode, gpuResource, gpuAssignment, backend, "
            "template, loader, restartPolicy, rendezvous, shmSize, runPolicy, stallPolicy, "
            "scheduling");
  EXPECT_EQ(ParseError(WithSpec("  loader:\n    nodes: 2\n")),
            "job.yaml:12:5: spec.loader.nodes: unknown field (did you mean spec.nodes?); allowed: "
            "workersPerRank, prefetchFactor, persistentWorkers, pinMemory, timeoutSeconds, seed, "
            "startMethod, workerCommand, pythonPool, preloadModules");
}

TEST(TrainingJob, AliasExpansionIsBounded) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  char prev = 'a';
  for (char c = 'b'; c <= 'h'; ++c) {
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) bomb += std::string(i ? ", *" : "*") + prev;
    bomb += "]\n";
    prev = c;
  }
  EXPECT_EQ(ParseError(bomb),
            "job.yaml:1:35: the document has more than 100000 values (recursive aliases?)");
}

}  // namespace
}  // namespace spawnpoint::api

namespace spawnpoint::api {
namespace {

// A template with what real pods carry: quantities, security contexts, volumes, probes.
constexpr const char* kFullTemplate = R"(apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: job}
spec:
  template:
    metadata:
      labels: {team: vision, example.com/any-key: x}
      annotations: {example.com/note: "free text"}
      creationTimestamp: null
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 1000}
      nodeSelector: {example.com/pool: gpu}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      volumes:
        - {name: data, emptyDir: {sizeLimit: 1Gi}}
        - {name: cfg, configMap: {name: cfg, defaultMode: 0644}}
      containers:
        - name: trainer
          image: ghcr.io/example/resnet:2.1
          command: [python3, train.py]
          args: [--epochs, "2"]
          resources:
            limits: {cpu: 2, memory: 4Gi, example.com/fpga: 1}
            requests: {cpu: 500m, memory: 1.5Gi}
          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 5}
          volumeMounts: [{name: data, mountPath: /data}]
          env:
            - {name: A, value: "1"}
)";

std::string LocalError(const std::string& yaml) {
  auto jobs = ParseTrainingJobs(yaml, "job.yaml", {.local = true});
  if (jobs.ok()) return "accepted";
  return jobs.status().message();
}

TEST(PodTemplateSchema, AFullTemplateIsAcceptedLocallyAndOnTheCluster) {
  auto jobs = ParseTrainingJobs(kFullTemplate, "job.yaml", {.local = true});
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  EXPECT_EQ(jobs->front().spec.trainer.args, (std::vector<std::string>{"--epochs", "2"}));
  auto object = json::parse(TrainingJobToJson(jobs->front()).dump());
  EXPECT_TRUE(TrainingJobFromJson(object).ok());
}

TEST(PodTemplateSchema, TyposAreUnknownFieldsWithLocationAndSuggestion) {
  std::string yaml = kFullTemplate;
  yaml.replace(yaml.find("          args:"), 15, "          arg: ");
  std::string error = ParseError(yaml);
  EXPECT_TRUE(
      error.starts_with("job.yaml:21:11: spec.template.spec.containers[0].arg: unknown "
                        "field (did you mean \"args\"?); allowed: args, command,"))
      << error;
  yaml = kFullTemplate;
  yaml.replace(yaml.find("periodSeconds"), 13, "periodSecond");
  EXPECT_TRUE(ParseError(yaml).starts_with(
      "job.yaml:27:67: spec.template.spec.containers[0].readinessProbe.periodSecond: unknown "
      "field (did you mean \"periodSeconds\"?)"))
      << ParseError(yaml);
  yaml = kFullTemplate;
  yaml.replace(yaml.find("fsGroup"), 7, "fsgroup");
  EXPECT_TRUE(ParseError(yaml).starts_with(
      "job.yaml:11:62: spec.template.spec.securityContext.fsgroup: unknown field (did you mean "
      "\"fsGroup\"?)"))
      << ParseError(yaml);
  // The operator's path (JSON from the API server) checks the same schema.
  json object = TrainingJobToJson(ParseOne(kFullTemplate));
  object["spec"]["template"]["spec"]["containers"][0]["arg"] = json::array({"x"});
  auto job = TrainingJobFromJson(object);
  ASSERT_FALSE(job.ok());
  EXPECT_TRUE(job.status().message().starts_with(
      "spec.template.spec.containers[0].arg: unknown field (did you mean \"args\"?)"));
}

TEST(PodTemplateSchema, TypesAreCheckedWithTheFieldPath) {
  auto replaced = [](const std::string& from, const std::string& to) {
    std::string yaml = kFullTemplate;
    yaml.replace(yaml.find(from), from.size(), to);
    return ParseError(yaml);
  };
  EXPECT_EQ(replaced("securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 1000}",
                     "securityContext: restricted"),
            "job.yaml:11:24: spec.template.spec.securityContext: must be an object, got string "
            "\"restricted\"");
  EXPECT_EQ(replaced("containerPort: 8080", "containerPort: http"),
            "job.yaml:26:47: spec.template.spec.containers[0].ports[0].containerPort: must be an "
            "integer, got string \"http\"");
  EXPECT_EQ(replaced("memory: 4Gi", "memory: 4 GiB"),
            "job.yaml:23:38: spec.template.spec.containers[0].resources.limits.memory: must be a "
            "quantity such as \"2\", \"500m\" or \"4Gi\", got \"4 GiB\"");
  EXPECT_EQ(replaced("cpu: 500m", "cpu: 0.5"),
            "job.yaml:24:29: spec.template.spec.containers[0].resources.requests.cpu: must be an "
            "integer or a quantity string such as \"500m\" or \"4Gi\" (quote a fraction: "
            "\"0.5\"), got number 0.5");
  EXPECT_EQ(replaced("runAsNonRoot: true", "runAsNonRoot: sure"),
            "job.yaml:11:39: spec.template.spec.securityContext.runAsNonRoot: must be a boolean "
            "(true or false), got string \"sure\"");
  EXPECT_EQ(replaced("labels: {team: vision", "labels: {team: 7"),
            "job.yaml:7:22: spec.template.metadata.labels.team: must be a string, got number 7 "
            "(quote it to make it a string)");
  EXPECT_EQ(
      replaced("- {name: A, value: \"1\"}", "- {name: A, value: \"1\"}\n            - {name: A}"),
      "job.yaml:31:15: spec.template.spec.containers[0].env[1]: duplicate entry (name "
      "\"A\") also at index 0; each must be unique");
  EXPECT_EQ(replaced("mountPath: /data", "mountPath: null"),
            "job.yaml:28:50: spec.template.spec.containers[0].volumeMounts[0].mountPath: required");
}

TEST(PodTemplateSchema, LocalRunsRejectWhatOnlyAKubeletResolves) {
  std::string yaml = std::string(kFullTemplate) +
                     "            - name: POD_NAME\n"
                     "              valueFrom: {fieldRef: {fieldPath: metadata.name}}\n";
  EXPECT_EQ(LocalError(yaml),
            "job.yaml:32:26: spec.template.spec.containers[0].env[1].valueFrom: a local run "
            "cannot resolve valueFrom (fieldRef metadata.name); give value: instead, or run on "
            "the cluster");
  // In a pod the kubelet resolves it: the entry stays in the template, not in trainer.env.
  TrainingJob job = ParseOne(yaml);
  ASSERT_EQ(job.spec.trainer.env.size(), 1u);
  EXPECT_EQ(job.spec.pod_template["spec"]["containers"][0]["env"][1]["valueFrom"]["fieldRef"]
                                 ["fieldPath"],
            "metadata.name");

  yaml = std::string(kFullTemplate) +
         "            - {name: TOKEN, valueFrom: {secretKeyRef: {name: wandb, key: token}}}\n";
  EXPECT_TRUE(LocalError(yaml).find("env[1].valueFrom: a local run cannot resolve valueFrom "
                                    "(secretKeyRef wandb/token)") != std::string::npos)
      << LocalError(yaml);
  yaml = std::string(kFullTemplate) + "          envFrom: [{configMapRef: {name: cfg}}]\n";
  EXPECT_EQ(LocalError(yaml),
            "job.yaml:31:21: spec.template.spec.containers[0].envFrom[0]: a local run cannot "
            "resolve envFrom (configMapRef cfg); set the variables with env and value: instead, "
            "or run on the cluster");
  EXPECT_EQ(ParseError(yaml), "accepted");
}

TEST(PodTemplateSchema, Quantities) {
  for (const char* good :
       {"1", "0", "+2", "-1", "500m", "1.5Gi", "1.", ".5", "2E", "1e3", "1E-3", "7Ki", "100n"}) {
    EXPECT_TRUE(IsQuantity(good)) << good;
  }
  for (const char* bad : {"", "Gi", "1 Gi", "1GB", "1e", "1.5.5", "lots", "1Mii", "."}) {
    EXPECT_FALSE(IsQuantity(bad)) << bad;
  }
}

}  // namespace
}  // namespace spawnpoint::api
