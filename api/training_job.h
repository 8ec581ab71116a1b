// The TrainingJob API (spawnpoint.dev/v1alpha1), shared by the operator and the agent:
// typed spec, defaulting, validation, and (de)serialisation from YAML and JSON.
// All functions are pure and thread-safe. Errors name where the problem is: for YAML the
// file, line and column plus the field path ("job.yaml:12:20: spec.loader.prefetchFactor:
// must be >= 1, got 0"); for JSON the field path.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/scheduling.h"
#include "api/stall_policy.h"
#include "api/torchrun_command.h"
#include "common/status.h"

namespace spawnpoint::api {

inline constexpr const char* kGroup = "spawnpoint.dev";
inline constexpr const char* kVersion = "v1alpha1";
inline constexpr const char* kApiVersion = "spawnpoint.dev/v1alpha1";
inline constexpr const char* kKind = "TrainingJob";

enum class GpuAssignment { kShared, kExclusive };
enum class Backend { kAuto, kNccl, kGloo };
enum class CleanPodPolicy { kNone, kRunning, kAll };
// restartPolicy.mode: how a gang spanning several pods restarts on Kubernetes. kInPlace: the
// pods, their agents, loader workers and /dev/shm stay; the agents stop every rank and start
// the next attempt together (only a lost pod is recreated). kRecreate: every pod of the
// attempt is deleted and the gang recreated.
enum class RestartMode { kInPlace, kRecreate };

struct LoaderSpec {
  std::optional<int> workers_per_rank;  // nullopt means "auto"
  int prefetch_factor = 2;
  // persistent_workers=True for DataLoaders whose code did not choose; false (the default):
  // the code's choice, as under torchrun (the agent's pool keeps its worker processes warm
  // across epochs either way).
  bool persistent_workers = false;
  bool pin_memory = true;
  int timeout_seconds = 120;
  uint64_t seed = 0;
  std::string start_method = "spawn";
  std::vector<std::string> worker_command;
  // Python ranks: an agent-owned pool of Python loader workers (false: the DataLoader
  // spawns its own, through the shim).
  bool python_pool = true;
  // Dotted module names each Python loader worker imports before its first batch;
  // "__main__" stands for the modules the trainer's script imports at its top (see
  // docs/trainingjob.md).
  std::vector<std::string> preload_modules = {"torch", "__main__"};
};

struct RestartPolicy {
  RestartMode mode = RestartMode::kInPlace;
  int max_restarts = 3;
  int backoff_seconds = 10;
  // An attempt that ran this long before failing was healthy: the quick-failure count (and
  // with it the backoff) starts again (api/restart_rule.h).
  int reset_after_seconds = 600;
  std::vector<int> retryable_exit_codes;  // empty: 128-255 are retryable
  // restartPolicy.retryOn: exit codes and failure causes (api/restart_rule.h's
  // kFailureCauses) that restart the gang. With retryableExitCodes, they replace the default.
  std::vector<int> retry_on_exit_codes;
  std::vector<std::string> retry_on_causes;
  // A warm standby per Python rank, released into the next attempt (agent/run/standby_rank.h):
  // a restart does not wait for the rank's imports. Costs a process's memory per rank.
  bool standby = true;
};

struct RunPolicy {
  bool suspend = false;
  std::optional<int64_t> active_deadline_seconds;
  std::optional<int64_t> ttl_seconds_after_finished;
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kRunning;
};

// A literal env entry of the trainer container. Entries with valueFrom stay only in the
// template JSON: in a pod the kubelet resolves them into the pod's environment, which the
// agent passes to the ranks; a local run rejects them (ParseOptions::local).
struct EnvVar {
  std::string name;
  std::string value;
};

// The container that runs the job: the one named "trainer", else the first.
struct TrainerContainer {
  std::string name;
  std::string image;
  std::vector<std::string> command;
  std::vector<std::string> args;
  std::vector<EnvVar> env;
  std::string working_dir;
  // Set when command + args started torchrun (api/torchrun_command.h): command is then what
  // one rank runs, without torchrun, and args is empty; this says how it was written.
  std::optional<TorchrunLaunch> torchrun;
  // Where each element of command + args was written (before a torchrun command is
  // rewritten), as a located error names it: "job.yaml:14:16:
  // spec.template.spec.containers[0].args[0]" from a manifest, the field path alone from an
  // API object; empty for a job made in code.
  std::vector<std::string> argv_origins;
};

struct TrainingJobSpec {
  int nodes = 1;
  int gpus_per_node = 0;
  int procs_per_node = 1;
  std::string gpu_resource = "nvidia.com/gpu";
  GpuAssignment gpu_assignment = GpuAssignment::kShared;
  Backend backend = Backend::kAuto;
  nlohmann::json pod_template;  // the PodTemplateSpec as given (defaults not expanded)
  TrainerContainer trainer;     // extracted from pod_template
  LoaderSpec loader;
  RestartPolicy restart_policy;
  StallPolicy stall_policy;
  int rendezvous_port = 29500;
  std::string shm_size = "8Gi";
  int64_t shm_size_bytes = 8LL << 30;
  RunPolicy run_policy;
  SchedulingSpec scheduling;  // spec.scheduling (api/scheduling.h)
};

struct TrainingJob {
  std::string name;
  std::string namespace_ = "default";
  nlohmann::json metadata;  // as given
  TrainingJobSpec spec;
  nlohmann::json status;  // as given (the operator owns its typed form)
  std::string source;     // "file.yaml" or "file.yaml (document 2)", for messages
};

// Ranks on one node: gpusPerNode when > 0, else procsPerNode.
int RanksPerNode(const TrainingJobSpec& spec);
int WorldSize(const TrainingJobSpec& spec);
// kAuto resolves to NCCL with GPUs (or RCCL under the same name on AMD), else Gloo.
Backend EffectiveBackend(const TrainingJobSpec& spec);
const char* BackendName(Backend backend);
// The API spelling: "shared", "exclusive"; "None", "Running", "All".
const char* GpuAssignmentName(GpuAssignment assignment);
const char* CleanPodPolicyName(CleanPodPolicy policy);
// "InPlace", "Recreate".
const char* RestartModeName(RestartMode mode);

// Parses a Kubernetes quantity ("8Gi", "512Mi", "1G", "1000000", "1.5Gi") into bytes.
StatusOr<int64_t> ParseQuantity(std::string_view text);

struct ParseOptions {
  // The job runs here, without a kubelet (spawnpoint-agent run/plan -f): the trainer
  // container's env entries with valueFrom and its envFrom are errors, since nothing can
  // resolve them (false: in a pod, where the kubelet does).
  bool local = false;
};

// Parses every document of a YAML stream (JSON is YAML) and returns the TrainingJobs in
// it, defaulted and validated. Documents of other kinds are an error (naming kind and
// document); empty documents are skipped, but a stream without any is an error. `source`
// names the input in messages (usually the file path). Unquoted scalars mean what they mean
// to kubectl (YAML 1.1): yes/no/on/off are booleans and 0644 is octal. spec.template is
// checked against Kubernetes' PodTemplateSpec schema, the one in the CRD (api/schema.h):
// unknown fields and wrong types inside it are errors, as with kubectl's strict validation.
StatusOr<std::vector<TrainingJob>> ParseTrainingJobs(std::string_view text,
                                                     const std::string& source,
                                                     ParseOptions options = {});
// Reads the file and calls ParseTrainingJobs; an unreadable file is an error naming it.
StatusOr<std::vector<TrainingJob>> LoadTrainingJobsFile(const std::string& path,
                                                        ParseOptions options = {});

// From an API object (as the operator receives it): defaulted and validated; errors name
// the field path.
StatusOr<TrainingJob> TrainingJobFromJson(const nlohmann::json& object);
// The full object, spec with defaults filled in; status as stored.
nlohmann::json TrainingJobToJson(const TrainingJob& job);

}  // namespace spawnpoint::api
