#include "api/training_job.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <utility>

#include "api/field_path.h"
#include "api/field_reader.h"
#include "api/loader_spec.h"
#include "api/restart_rule.h"
#include "api/schema.h"
#include "api/torchrun_spec.h"
#include "api/yaml_to_json.h"

namespace spawnpoint::api {
namespace {

using nlohmann::json;

// Pod names are "<job>-node-<index>" and must stay within a 63-character DNS label.
constexpr size_t kMaxNameLength = 52;
// The most GPUs one job may ask (nodes x gpusPerNode), as the CRD's rule says.
constexpr int64_t kMaxJobGpus = 32768;

constexpr std::string_view kTopFields[] = {"apiVersion", "kind", "metadata", "spec", "status"};
constexpr std::string_view kSpecFields[] = {
    "nodes",   "gpusPerNode", "procsPerNode", "gpuResource",   "gpuAssignment",
    "backend", "template",    "loader",       "restartPolicy", "rendezvous",
    "shmSize", "runPolicy",   "stallPolicy",  "scheduling"};
constexpr std::string_view kRendezvousFields[] = {"port"};
constexpr std::string_view kRunPolicyFields[] = {"suspend", "activeDeadlineSeconds",
                                                 "ttlSecondsAfterFinished", "cleanPodPolicy"};

struct KnownObject {
  std::string_view path;
  std::span<const std::string_view> fields;
};
// Every object whose fields are checked; also used to tell a user that a field they put in
// the wrong place belongs elsewhere.
const KnownObject kKnownObjects[] = {
    {"", kTopFields},
    {"spec", kSpecFields},
    {"spec.loader", kLoaderFields},
    {"spec.restartPolicy", kRestartFields},
    {"spec.rendezvous", kRendezvousFields},
    {"spec.runPolicy", kRunPolicyFields},
    {"spec.stallPolicy", kStallFields},
    {"spec.scheduling", kSchedulingFields},
};

// " (did you mean spec.loader.prefetchFactor?)" when `key`, found in the object at `here`,
// is a field of another object; else "".
std::string MisplacedFieldHint(std::string_view key, std::string_view here) {
  std::string normalized = Normalize(key);
  for (const KnownObject& known : kKnownObjects) {
    if (known.path == here) continue;
    for (std::string_view field : known.fields) {
      if (Normalize(field) != normalized) continue;
      std::string where = known.path.empty() ? "" : std::string(known.path) + ".";
      return " (did you mean " + where + std::string(field) + "?)";
    }
  }
  return "";
}

// Indexed by the enums' values.
constexpr std::string_view kGpuAssignmentNames[] = {"shared", "exclusive"};
constexpr std::string_view kBackendNames[] = {"auto", "nccl", "gloo"};
constexpr std::string_view kCleanPodPolicyNames[] = {"None", "Running", "All"};
constexpr std::string_view kGpuResources[] = {"nvidia.com/gpu", "amd.com/gpu"};

// Decodes one TrainingJob object. Returns the first problem found; error_path() and
// error_at_key() then say where it is, so YAML callers can turn it into a line and column.
class Decoder : public FieldReader {
 public:
  // `document` is the document's number in a YAML stream (0 when decoding an API object);
  // `from_yaml` adds hints that only make sense in YAML text.
  Decoder(int document, bool from_yaml, ParseOptions options = {})
      : FieldReader(from_yaml, MisplacedFieldHint), document_(document), options_(options) {}

  Status Decode(const json& object, TrainingJob* job);
  // After Decode: the path of each element of the trainer's command + args.
  const std::vector<FieldPath>& trainer_argv_paths() const { return trainer_argv_paths_; }

 private:
  Status DecodeHeader(const json& object);
  Status DecodeMetadata(const json& object, TrainingJob* job);
  Status DecodeSpec(const Field& spec_field, TrainingJobSpec* spec);
  Status DecodeTemplate(const Field& field, TrainingJobSpec* spec);
  Status DecodeTrainer(const json& container, const FieldPath& path, TrainerContainer* trainer);
  Status DecodeEnv(const json& container, const FieldPath& path, TrainerContainer* trainer);
  Status DecodeRendezvous(const Field& field, int* port);
  Status DecodeShmSize(const Field& field, TrainingJobSpec* spec);
  Status DecodeRunPolicy(const Field& field, RunPolicy* policy);

  const int document_;
  const ParseOptions options_;
  std::vector<FieldPath> trainer_argv_paths_;
};

// TrainerContainer::argv_origins: each element's place, by `locate` ("" for none) and path.
template <typename Locate>
std::vector<std::string> ArgvOrigins(const std::vector<FieldPath>& paths, Locate locate) {
  std::vector<std::string> out;
  for (const FieldPath& p : paths) out.push_back(locate(p) + p.Dotted());
  return out;
}

Status Decoder::Decode(const json& object, TrainingJob* job) {
  if (!object.is_object()) {
    return Fail(FieldPath(), std::string("a TrainingJob must be an object with apiVersion: ") +
                                 kApiVersion + ", kind: " + kKind + ", metadata and spec; got " +
                                 Describe(object));
  }
  SP_RETURN_IF_ERROR(DecodeHeader(object));
  SP_RETURN_IF_ERROR(CheckFields(object, FieldPath(), kTopFields));
  SP_RETURN_IF_ERROR(DecodeMetadata(object, job));
  SP_RETURN_IF_ERROR(DecodeSpec(Get(object, FieldPath(), "spec"), &job->spec));
  // Reads metadata too: Kueue users name the queue with a label on the job.
  SP_RETURN_IF_ERROR(DecodeScheduling(*this,
                                      Get(object.at("spec"), FieldPath() / "spec", "scheduling"),
                                      Get(object, FieldPath(), "metadata"), &job->spec.scheduling));
  auto status = object.find("status");
  job->status = status == object.end() ? json() : *status;
  return Status::Ok();
}

Status Decoder::DecodeHeader(const json& object) {
  // kind first: for a Deployment in the stream "not a TrainingJob" is the useful message.
  Field kind = Get(object, FieldPath(), "kind");
  std::string expected_kind = std::string("must be ") + Quote(kKind);
  if (!kind.value) return Fail(kind.path, "required; " + expected_kind);
  if (!kind.value->is_string()) return WrongType(kind, "the string " + Quote(kKind));
  std::string kind_name = kind.value->get<std::string>();
  if (kind_name != kKind) {
    if (document_ > 0) {
      return Fail(kind.path, "document " + std::to_string(document_) + " is a " + Quote(kind_name) +
                                 "; only kind " + Quote(kKind) + " (apiVersion " + kApiVersion +
                                 ") is allowed here");
    }
    return Fail(kind.path, expected_kind + ", got " + Quote(kind_name));
  }
  Field api_version = Get(object, FieldPath(), "apiVersion");
  std::string expected_version = std::string("must be ") + Quote(kApiVersion);
  if (!api_version.value) return Fail(api_version.path, "required; " + expected_version);
  if (!api_version.value->is_string()) {
    return WrongType(api_version, "the string " + Quote(kApiVersion));
  }
  if (api_version.value->get<std::string>() != kApiVersion) {
    return Fail(api_version.path,
                expected_version + ", got " + Quote(api_version.value->get<std::string>()));
  }
  return Status::Ok();
}

Status Decoder::DecodeMetadata(const json& object, TrainingJob* job) {
  Field metadata = Get(object, FieldPath(), "metadata");
  SP_RETURN_IF_ERROR(RequireObject(metadata, "ObjectMeta with at least a name"));
  job->metadata = *metadata.value;

  const std::string name_rule =
      "lowercase letters, digits and '-', starting with a letter and ending with a letter or "
      "digit, at most " +
      std::to_string(kMaxNameLength) + " characters (e.g. \"resnet-ddp\")";
  Field name = Get(*metadata.value, metadata.path, "name");
  if (!name.value) return Fail(name.path, "required; " + name_rule);
  if (!name.value->is_string()) return WrongType(name, "a string of " + name_rule);
  job->name = name.value->get<std::string>();
  if (job->name.size() > kMaxNameLength) {
    return Fail(name.path, "must be at most " + std::to_string(kMaxNameLength) +
                               " characters (pod names add \"-node-NNN\" and must fit in 63), "
                               "got " +
                               std::to_string(job->name.size()));
  }
  if (!IsDnsLabel(job->name, /*first_may_be_digit=*/false)) {
    return Fail(name.path, "must consist of " + name_rule + ", got " + Quote(job->name));
  }

  Field ns = Get(*metadata.value, metadata.path, "namespace");
  job->namespace_ = "default";
  SP_RETURN_IF_ERROR(ReadString(ns, &job->namespace_));
  if (ns.value && (job->namespace_.size() > 63 || !IsDnsLabel(job->namespace_, true))) {
    return Fail(ns.path,
                "must be a DNS label: lowercase letters, digits and '-', starting and ending with "
                "a letter or digit, at most 63 characters; got " +
                    Quote(job->namespace_));
  }
  return Status::Ok();
}

Status Decoder::DecodeSpec(const Field& spec_field, TrainingJobSpec* spec) {
  SP_RETURN_IF_ERROR(RequireObject(spec_field, "the TrainingJobSpec"));
  const json& s = *spec_field.value;
  const FieldPath& path = spec_field.path;
  SP_RETURN_IF_ERROR(CheckFields(s, path, kSpecFields));

  SP_RETURN_IF_ERROR(ReadInt(Get(s, path, "nodes"), 1, kIntMax, &spec->nodes));
  SP_RETURN_IF_ERROR(ReadInt(Get(s, path, "gpusPerNode"), 0, kIntMax, &spec->gpus_per_node));
  SP_RETURN_IF_ERROR(ReadInt(Get(s, path, "procsPerNode"), 1, kIntMax, &spec->procs_per_node));
  if (static_cast<int64_t>(spec->nodes) * RanksPerNode(*spec) > kIntMax) {
    return Fail(path / "nodes",
                "the world size (nodes x ranks per node = " + std::to_string(spec->nodes) + " x " +
                    std::to_string(RanksPerNode(*spec)) +
                    ") must be <= " + std::to_string(kIntMax));
  }

  if (static_cast<int64_t>(spec->nodes) * spec->gpus_per_node > kMaxJobGpus) {
    return Fail(path / "nodes",
                "the job's GPUs (nodes x gpusPerNode = " + std::to_string(spec->nodes) + " x " +
                    std::to_string(spec->gpus_per_node) + ") must be at most " +
                    std::to_string(kMaxJobGpus));
  }

  Field gpu_resource = Get(s, path, "gpuResource");
  if (gpu_resource.value) {
    size_t index = 0;
    SP_RETURN_IF_ERROR(ReadChoice(gpu_resource, kGpuResources, &index));
    spec->gpu_resource = kGpuResources[index];
  }
  SP_RETURN_IF_ERROR(
      ReadEnum(Get(s, path, "gpuAssignment"), kGpuAssignmentNames, &spec->gpu_assignment));
  Field backend = Get(s, path, "backend");
  SP_RETURN_IF_ERROR(ReadEnum(backend, kBackendNames, &spec->backend));
  if (spec->backend == Backend::kNccl && spec->gpus_per_node == 0) {
    return Fail(backend.path,
                "\"nccl\" needs GPUs but spec.gpusPerNode is 0; use \"gloo\" or \"auto\" for CPU "
                "ranks, or set gpusPerNode >= 1");
  }

  SP_RETURN_IF_ERROR(DecodeTemplate(Get(s, path, "template"), spec));
  SP_RETURN_IF_ERROR(DecodeLoaderSpec(*this, Get(s, path, "loader"), &spec->loader));
  SP_RETURN_IF_ERROR(
      DecodeRestartPolicy(*this, Get(s, path, "restartPolicy"), &spec->restart_policy));
  SP_RETURN_IF_ERROR(DecodeRendezvous(Get(s, path, "rendezvous"), &spec->rendezvous_port));
  SP_RETURN_IF_ERROR(DecodeShmSize(Get(s, path, "shmSize"), spec));
  SP_RETURN_IF_ERROR(DecodeRunPolicy(Get(s, path, "runPolicy"), &spec->run_policy));
  SP_RETURN_IF_ERROR(DecodeStallPolicy(*this, Get(s, path, "stallPolicy"), &spec->stall_policy));
  // A command that starts torchrun: the agent launches what it would (needs the spec above).
  return ApplyTorchrunCommand(s, path, spec, this);
}

Status Decoder::DecodeTemplate(const Field& field, TrainingJobSpec* spec) {
  SP_RETURN_IF_ERROR(
      RequireObject(field, "a PodTemplateSpec whose spec.containers holds the trainer container"));
  spec->pod_template = *field.value;
  Field pod_spec = Get(*field.value, field.path, "spec");
  SP_RETURN_IF_ERROR(RequireObject(pod_spec, "a PodSpec with the trainer in containers"));
  Field containers = Get(*pod_spec.value, pod_spec.path, "containers");
  const std::string need = "a list of containers; the one named \"trainer\" (or the first) runs";
  if (!containers.value) return Fail(containers.path, "required; " + need);
  if (!containers.value->is_array()) return WrongType(containers, need);
  if (containers.value->empty()) {
    return Fail(containers.path,
                "must hold at least one container (the one named \"trainer\", or "
                "the first, runs the job)");
  }
  size_t trainer = 0;
  for (size_t i = 0; i < containers.value->size(); ++i) {
    const json& container = (*containers.value)[i];
    if (!container.is_object()) {
      return WrongType({&container, containers.path.Index(i)}, "an object (a Container)");
    }
    auto name = container.find("name");
    if (name != container.end() && name->is_string() && *name == "trainer") {
      trainer = i;
      break;
    }
  }
  // Typos and wrong types anywhere in the template, as the API server finds them.
  SP_RETURN_IF_ERROR(CheckSchema(*field.value, field.path, PodTemplateSchema(), this));
  return DecodeTrainer((*containers.value)[trainer], containers.path.Index(trainer),
                       &spec->trainer);
}

Status Decoder::DecodeTrainer(const json& container, const FieldPath& path,
                              TrainerContainer* trainer) {
  SP_RETURN_IF_ERROR(ReadString(Get(container, path, "name"), &trainer->name));
  SP_RETURN_IF_ERROR(ReadString(Get(container, path, "image"), &trainer->image));
  SP_RETURN_IF_ERROR(ReadStringList(Get(container, path, "command"), &trainer->command));
  SP_RETURN_IF_ERROR(ReadStringList(Get(container, path, "args"), &trainer->args));
  SP_RETURN_IF_ERROR(ReadString(Get(container, path, "workingDir"), &trainer->working_dir));
  for (size_t i = 0; i < trainer->command.size(); ++i) {
    trainer_argv_paths_.push_back((path / "command").Index(i));
  }
  for (size_t i = 0; i < trainer->args.size(); ++i) {
    trainer_argv_paths_.push_back((path / "args").Index(i));
  }
  if (trainer->command.empty() && trainer->args.empty()) {
    return Fail(path,
                "the trainer container needs a command or args (command + args is what "
                "every rank runs)");
  }
  bool from_command = !trainer->command.empty();
  const std::string& program = from_command ? trainer->command.front() : trainer->args.front();
  if (program.empty()) {
    FieldPath list = path / (from_command ? "command" : "args");
    return Fail(list.Index(0), "must not be empty: it is the program every rank runs");
  }
  return DecodeEnv(container, path, trainer);
}

// "fieldRef metadata.name", "secretKeyRef s/k": what a valueFrom or envFrom entry reads.
std::string DescribeSource(const json& source) {
  if (!source.is_object() || source.empty()) return Describe(source);
  // Not a structured binding of *items().begin(): that binds to a proxy that dies at once.
  const auto first = source.begin();
  const std::string& kind = first.key();
  const json& ref = first.value();
  std::string what = kind;
  if (!ref.is_object()) return what;
  for (const char* key : {"fieldPath", "resource", "name", "path"}) {
    auto it = ref.find(key);
    if (it == ref.end() || !it->is_string()) continue;
    what += " " + it->get<std::string>();
    auto sub = ref.find("key");
    if (sub != ref.end() && sub->is_string()) what += "/" + sub->get<std::string>();
    break;
  }
  return what;
}

Status Decoder::DecodeEnv(const json& container, const FieldPath& path, TrainerContainer* trainer) {
  Field env_from = Get(container, path, "envFrom");
  if (options_.local && env_from.value && !env_from.value->empty()) {
    Field first{&(*env_from.value)[0], env_from.path.Index(0)};
    return Fail(first.path, "a local run cannot resolve envFrom (" + DescribeSource(*first.value) +
                                "); set the variables with env and value: instead, or run on "
                                "the cluster");
  }
  Field env = Get(container, path, "env");
  if (!env.value) return Status::Ok();
  if (!env.value->is_array()) return WrongType(env, "a list of {name, value} entries");
  for (size_t i = 0; i < env.value->size(); ++i) {
    Field entry{&(*env.value)[i], env.path.Index(i)};
    if (!entry.value->is_object()) {
      return WrongType(entry, "an object (an EnvVar with name and value or valueFrom)");
    }
    EnvVar var;
    Field name = Get(*entry.value, entry.path, "name");
    if (!name.value) return Fail(name.path, "required; the environment variable's name");
    SP_RETURN_IF_ERROR(ReadString(name, &var.name));
    // valueFrom is resolved by the kubelet; such entries stay only in pod_template.
    if (Field from = Get(*entry.value, entry.path, "valueFrom"); from.value) {
      if (!options_.local) continue;
      return Fail(from.path, "a local run cannot resolve valueFrom (" +
                                 DescribeSource(*from.value) +
                                 "); give value: instead, or run on the cluster");
    }
    SP_RETURN_IF_ERROR(ReadString(Get(*entry.value, entry.path, "value"), &var.value));
    trainer->env.push_back(std::move(var));
  }
  return Status::Ok();
}

Status Decoder::DecodeRendezvous(const Field& field, int* port) {
  if (!field.value) return Status::Ok();
  SP_RETURN_IF_ERROR(
      CheckObject(*field.value, field.path, "the rendezvous settings", kRendezvousFields));
  return ReadInt(Get(*field.value, field.path, "port"), 1, 65535, port);
}

Status Decoder::DecodeShmSize(const Field& field, TrainingJobSpec* spec) {
  if (!field.value) return Status::Ok();
  if (field.value->is_number_integer() || field.value->is_number_unsigned()) {
    spec->shm_size = field.value->dump();
  } else if (field.value->is_string()) {
    spec->shm_size = field.value->get<std::string>();
  } else {
    return WrongType(field, "a quantity such as \"8Gi\"");
  }
  StatusOr<int64_t> bytes = ParseQuantity(spec->shm_size);
  if (!bytes.ok()) return Fail(field.path, bytes.status().message());
  if (*bytes <= 0) {
    return Fail(field.path,
                "must be > 0 (a size for /dev/shm such as \"8Gi\"), got " + Quote(spec->shm_size));
  }
  spec->shm_size_bytes = *bytes;
  return Status::Ok();
}

Status Decoder::DecodeRunPolicy(const Field& field, RunPolicy* policy) {
  if (!field.value) return Status::Ok();
  SP_RETURN_IF_ERROR(CheckObject(*field.value, field.path, "the run policy", kRunPolicyFields));
  const json& r = *field.value;
  SP_RETURN_IF_ERROR(ReadBool(Get(r, field.path, "suspend"), &policy->suspend));
  SP_RETURN_IF_ERROR(ReadOptionalInt64(Get(r, field.path, "activeDeadlineSeconds"), 1,
                                       &policy->active_deadline_seconds));
  SP_RETURN_IF_ERROR(ReadOptionalInt64(Get(r, field.path, "ttlSecondsAfterFinished"), 0,
                                       &policy->ttl_seconds_after_finished));
  return ReadEnum(Get(r, field.path, "cleanPodPolicy"), kCleanPodPolicyNames,
                  &policy->clean_pod_policy);
}

}  // namespace

int RanksPerNode(const TrainingJobSpec& spec) {
  return spec.gpus_per_node > 0 ? spec.gpus_per_node : spec.procs_per_node;
}

int WorldSize(const TrainingJobSpec& spec) { return spec.nodes * RanksPerNode(spec); }

Backend EffectiveBackend(const TrainingJobSpec& spec) {
  if (spec.backend != Backend::kAuto) return spec.backend;
  return spec.gpus_per_node > 0 ? Backend::kNccl : Backend::kGloo;
}

const char* BackendName(Backend backend) {
  return kBackendNames[static_cast<size_t>(backend)].data();
}

const char* GpuAssignmentName(GpuAssignment assignment) {
  return kGpuAssignmentNames[static_cast<size_t>(assignment)].data();
}

const char* CleanPodPolicyName(CleanPodPolicy policy) {
  return kCleanPodPolicyNames[static_cast<size_t>(policy)].data();
}

StatusOr<std::vector<TrainingJob>> ParseTrainingJobs(std::string_view text,
                                                     const std::string& source,
                                                     ParseOptions options) {
  SP_ASSIGN_OR_RETURN(std::vector<YamlDocument> documents, ParseYamlStream(text, source));
  size_t non_empty = std::count_if(documents.begin(), documents.end(),
                                   [](const YamlDocument& d) { return !d.value.is_null(); });
  if (non_empty == 0) {
    return InvalidArgument(source +
                           ":1:1: no TrainingJob found: the input has no YAML documents; "
                           "expected one or more documents with apiVersion: " +
                           std::string(kApiVersion) + ", kind: " + kKind);
  }
  std::vector<TrainingJob> jobs;
  for (const YamlDocument& document : documents) {
    if (document.value.is_null()) continue;
    Decoder decoder(document.number, /*from_yaml=*/true, options);
    TrainingJob job;
    Status status = decoder.Decode(document.value, &job);
    if (!status.ok()) {
      SourcePosition at = document.positions.Locate(decoder.error_path(), decoder.error_at_key());
      return InvalidArgument(source + ":" + std::to_string(at.line) + ":" +
                             std::to_string(at.column) + ": " + status.message());
    }
    job.source =
        non_empty == 1 ? source : source + " (document " + std::to_string(document.number) + ")";
    job.spec.trainer.argv_origins =
        ArgvOrigins(decoder.trainer_argv_paths(), [&](const FieldPath& p) {
          SourcePosition at = document.positions.Locate(p, /*at_key=*/false);
          return source + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": ";
        });
    jobs.push_back(std::move(job));
  }
  return jobs;
}

StatusOr<std::vector<TrainingJob>> LoadTrainingJobsFile(const std::string& path,
                                                        ParseOptions options) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot read " + path + ": " + std::strerror(errno));
  std::string text;
  char buffer[65536];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int error = errno;
      ::close(fd);
      return NotFound("cannot read " + path + ": " + std::strerror(error));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return ParseTrainingJobs(text, path, options);
}

StatusOr<TrainingJob> TrainingJobFromJson(const json& object) {
  Decoder decoder(/*document=*/0, /*from_yaml=*/false);
  TrainingJob job;
  SP_RETURN_IF_ERROR(decoder.Decode(object, &job));
  job.spec.trainer.argv_origins =
      ArgvOrigins(decoder.trainer_argv_paths(), [](const FieldPath&) { return std::string(); });
  return job;
}

}  // namespace spawnpoint::api
