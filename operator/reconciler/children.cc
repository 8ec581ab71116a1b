#include "operator/reconciler/children.h"

#include <algorithm>
#include <set>

#include "common/env_parts.h"
#include "common/random.h"
#include "operator/common/names.h"
#include "operator/common/object.h"
#include "operator/reconciler/pod_group.h"

namespace spawnpoint::op {
namespace {

using nlohmann::json;

json Env(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

json FieldEnv(const std::string& name, const std::string& path) {
  return {{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", path}}}}}};
}

// Replaces entries of `list` whose `key` equals one of `ours`' and appends `ours`.
void MergeByKey(json& list, const json& ours, const char* key) {
  if (!list.is_array()) list = json::array();
  std::set<std::string> names;
  for (const auto& e : ours) names.insert(e.value(key, ""));
  json kept = json::array();
  for (auto& e : list) {
    if (e.is_object() && names.count(e.value(key, ""))) continue;
    kept.push_back(e);
  }
  for (const auto& e : ours) kept.push_back(e);
  list = std::move(kept);
}

size_t TrainerIndex(const json& containers) {
  for (size_t i = 0; i < containers.size(); ++i) {
    if (containers[i].is_object() && containers[i].value("name", "") == "trainer") return i;
  }
  return 0;
}

json Labels(const api::TrainingJob& job, const json& base) {
  json labels = base.is_object() ? base : json::object();
  labels[kJobNameLabel] = job.name;
  return labels;
}

}  // namespace

json ControllerReference(const json& owner) {
  return {{"apiVersion", api::kApiVersion},
          {"kind", api::kKind},
          {"name", NameOf(owner)},
          {"uid", UidOf(owner)},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

std::string TrainerContainerName(const api::TrainingJob& job) {
  return job.spec.trainer.name.empty() ? "trainer" : job.spec.trainer.name;
}

std::string MasterAddr(const api::TrainingJob& job, const PodSettings& settings) {
  json meta = job.metadata.is_object() ? job.metadata : json::object();
  std::string annotated =
      meta.value("annotations", json::object()).value(kMasterAddrAnnotation, "");
  if (!annotated.empty()) return annotated;
  if (!settings.master_addr.empty()) return settings.master_addr;
  return DefaultMasterAddr(job.name);
}

std::string AgentPath(const api::TrainingJob& job, const PodSettings& settings) {
  json meta = job.metadata.is_object() ? job.metadata : json::object();
  std::string annotated = meta.value("annotations", json::object()).value(kAgentPathAnnotation, "");
  if (!annotated.empty()) return annotated;
  if (!settings.agent_path.empty()) return settings.agent_path;
  return std::string(kAgentMountPath) + "/bin/spawnpoint-agent";
}

bool RestartsInPlace(const api::TrainingJob& job) {
  return job.spec.restart_policy.mode == api::RestartMode::kInPlace && job.spec.nodes > 1;
}

json BuildJobSecret(const api::TrainingJob& job, const json& owner, const std::string& gang_token,
                    const std::string& status_token) {
  json data = json::object();
  if (!gang_token.empty()) data[kGangTokenKey] = gang_token;
  if (!status_token.empty()) data[kStatusTokenKey] = status_token;
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata",
           {{"name", JobSecretName(job.name, UidOf(owner))},
            {"namespace", job.namespace_},
            {"labels", Labels(job, json::object())},
            {"ownerReferences", json::array({ControllerReference(owner)})}}},
          {"type", "Opaque"},
          {"stringData", data}};
}

StatusOr<std::string> NewGangToken() { return RandomHex(32); }

json JobForAgent(const api::TrainingJob& job) {
  api::TrainingJob copy = job;
  copy.status = json();
  copy.metadata = {{"name", job.name}, {"namespace", job.namespace_}};
  return api::TrainingJobToJson(copy);
}

json BuildService(const api::TrainingJob& job, const json& owner) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata",
       {{"name", ServiceName(job.name)},
        {"namespace", job.namespace_},
        {"labels", Labels(job, json::object())},
        {"ownerReferences", json::array({ControllerReference(owner)})}}},
      {"spec",
       {{"clusterIP", "None"},
        {"publishNotReadyAddresses", true},
        {"selector", {{kJobNameLabel, job.name}}},
        {"ports", json::array({{{"name", "rendezvous"},
                                {"port", job.spec.rendezvous_port},
                                {"targetPort", job.spec.rendezvous_port},
                                {"protocol", "TCP"}}})}}},
  };
}

json BuildPod(const api::TrainingJob& job, const json& owner, int node, int attempt,
              const PodSettings& settings) {
  const api::TrainingJobSpec& spec = job.spec;
  const json& tmpl = spec.pod_template;
  json tmeta = tmpl.is_object() ? tmpl.value("metadata", json::object()) : json::object();
  json pod_spec = tmpl.is_object() ? tmpl.value("spec", json::object()) : json::object();
  const std::string name = PodName(job.name, node);

  json labels = Labels(job, tmeta.value("labels", json::object()));
  labels[kNodeRankLabel] = std::to_string(node);
  labels[kAttemptLabel] = std::to_string(attempt);
  json metadata = {{"name", name},
                   {"namespace", job.namespace_},
                   {"labels", labels},
                   {"ownerReferences", json::array({ControllerReference(owner)})}};
  json annotations = tmeta.value("annotations", json::object());
  if (annotations.is_object() && !annotations.empty()) metadata["annotations"] = annotations;

  // The operator, not the kubelet, restarts: a failed pod ends the attempt.
  pod_spec["restartPolicy"] = "Never";
  pod_spec["hostname"] = name;
  pod_spec["subdomain"] = ServiceName(job.name);

  const std::string agent = AgentPath(job, settings);
  const bool install_agent =
      AnnotationOf(json{{"metadata", job.metadata}}, kAgentPathAnnotation).empty() &&
      settings.agent_path.empty();

  const bool in_place = RestartsInPlace(job);
  json volumes = json::array(
      {{{"name", kShmVolume}, {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", spec.shm_size}}}}});
  if (install_agent) volumes.push_back({{"name", kAgentVolume}, {"emptyDir", json::object()}});
  const bool tokens = in_place || settings.status_token;
  if (tokens) {
    volumes.push_back({{"name", kTokensVolume},
                       {"secret", {{"secretName", JobSecretName(job.name, UidOf(owner))}}}});
  }
  MergeByKey(pod_spec["volumes"], volumes, "name");

  if (install_agent) {
    json init = {
        {"name", kAgentInstallContainer},
        {"image", settings.agent_image},
        // -R, not -a: the agent image runs as a non-root user, the emptyDir belongs to root,
        // and -a's attempt to copy the times of "." onto it fails the container.
        {"command", json::array({"cp", "-R", settings.agent_image_dir + "/.",
                                 std::string(kAgentMountPath) + "/"})},
        {"volumeMounts", json::array({{{"name", kAgentVolume}, {"mountPath", kAgentMountPath}}})},
        // Admitted under Pod Security "restricted" and within a namespace's ResourceQuota:
        // copying ~10 MB needs nothing else.
        {"securityContext",
         {{"runAsNonRoot", true},
          {"allowPrivilegeEscalation", false},
          {"readOnlyRootFilesystem", true},
          {"capabilities", {{"drop", json::array({"ALL"})}}},
          {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
        {"resources",
         {{"requests", {{"cpu", "10m"}, {"memory", "16Mi"}}},
          {"limits", {{"cpu", "500m"}, {"memory", "64Mi"}}}}}};
    json inits = json::array({init});
    for (const auto& c : pod_spec.value("initContainers", json::array())) {
      if (c.is_object() && c.value("name", "") == kAgentInstallContainer) continue;
      inits.push_back(c);
    }
    pod_spec["initContainers"] = inits;
  }

  json& containers = pod_spec["containers"];
  json& trainer = containers[TrainerIndex(containers)];
  const std::string master = MasterAddr(job, settings);
  const int ranks = api::RanksPerNode(spec);
  const int gang_port =
      settings.gang_port > 0 ? settings.gang_port : GangPort(spec.rendezvous_port);
  json command =
      json::array({agent, "run", "--job-env", kJobEnv, "--node-rank", std::to_string(node),
                   "--nnodes", std::to_string(spec.nodes), "--master-addr", master, "--master-port",
                   std::to_string(spec.rendezvous_port)});
  if (in_place) {
    // The agents restart the gang themselves, with the job's whole budget, counting from the
    // restarts made so far; node 0's agent coordinates on the gang port.
    for (const std::string& a :
         {std::string("--gang"), master + ":" + std::to_string(gang_port),
          std::string("--gang-token-file"), std::string(kTokensMountPath) + "/" + kGangTokenKey,
          std::string("--max-restarts"), std::to_string(spec.restart_policy.max_restarts)}) {
      command.push_back(a);
    }
  } else {
    command.push_back("--max-restarts");
    command.push_back("0");
  }
  if (settings.status_token) {
    // Another tenant's pod may reach the agent's port: log lines go to the token's holders.
    command.push_back("--status-token-file");
    command.push_back(std::string(kTokensMountPath) + "/" + kStatusTokenKey);
  }
  for (const std::string& a :
       {std::string("--restart-count"), std::to_string(attempt), std::string("--termination-log"),
        std::string("/dev/termination-log"),
        // Where the operator reads it (--agent-status-port), everywhere.
        std::string("--metrics-addr"), ":" + std::to_string(settings.status_port)}) {
    command.push_back(a);
  }
  trainer["command"] = command;
  trainer.erase("args");  // the trainer's command and args travel inside the job
  trainer["terminationMessagePath"] = "/dev/termination-log";
  trainer["terminationMessagePolicy"] = "FallbackToLogsOnError";

  // The job in one variable, or in parts when it is longer than one may be (common/env_parts.h):
  // a template of 200 KiB is valid, and would stop the pod with E2BIG.
  json env = json::array();
  for (const auto& [var, value] :
       SplitEnvValue(kJobEnv, JobForAgent(job).dump(-1, ' ', /*ensure_ascii=*/true))) {
    env.push_back(Env(var, value));
  }
  for (json e : json::array({
           Env("MASTER_ADDR", master),
           Env("MASTER_PORT", std::to_string(spec.rendezvous_port)),
           Env("WORLD_SIZE", std::to_string(api::WorldSize(spec))),
           Env("NNODES", std::to_string(spec.nodes)),
           Env("NODE_RANK", std::to_string(node)),
           Env("GROUP_RANK", std::to_string(node)),
           Env("LOCAL_WORLD_SIZE", std::to_string(ranks)),
           Env("NPROC_PER_NODE", std::to_string(ranks)),
           Env("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)),
           Env("TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.restart_policy.max_restarts)),
           Env("TORCHELASTIC_RUN_ID", UidOf(owner).empty() ? job.name : UidOf(owner)),
           FieldEnv("POD_NAME", "metadata.name"),
           FieldEnv("POD_NAMESPACE", "metadata.namespace"),
           // The agent's metrics labels (DCGM's `container` and `Hostname`).
           Env("CONTAINER_NAME", TrainerContainerName(job)),
           FieldEnv("NODE_NAME", "spec.nodeName"),
       })) {
    env.push_back(std::move(e));
  }
  MergeByKey(trainer["env"], env, "name");

  json mounts = json::array({{{"name", kShmVolume}, {"mountPath", "/dev/shm"}}});
  if (install_agent) mounts.push_back({{"name", kAgentVolume}, {"mountPath", kAgentMountPath}});
  if (tokens) {
    mounts.push_back(
        {{"name", kTokensVolume}, {"mountPath", kTokensMountPath}, {"readOnly", true}});
  }
  // Our /dev/shm replaces any mount the template put there.
  json kept = json::array();
  for (const auto& m : trainer.value("volumeMounts", json::array())) {
    if (m.is_object() && m.value("mountPath", "") == "/dev/shm") continue;
    kept.push_back(m);
  }
  trainer["volumeMounts"] = kept;
  MergeByKey(trainer["volumeMounts"], mounts, "name");

  json ports = json::array(
      {{{"name", "rendezvous"}, {"containerPort", spec.rendezvous_port}, {"protocol", "TCP"}},
       {{"name", "agent-status"}, {"containerPort", settings.status_port}, {"protocol", "TCP"}}});
  if (in_place) {
    ports.push_back({{"name", "gang"}, {"containerPort", gang_port}, {"protocol", "TCP"}});
  }
  MergeByKey(trainer["ports"], ports, "name");

  if (spec.gpus_per_node > 0) {
    json& resources = trainer["resources"];
    if (!resources.is_object()) resources = json::object();
    const std::string count = std::to_string(spec.gpus_per_node);
    resources["limits"][spec.gpu_resource] = count;
    resources["requests"][spec.gpu_resource] = count;
  }

  json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", metadata}, {"spec", pod_spec}};
  ApplyGangScheduling(job, owner, pod);
  return pod;
}

}  // namespace spawnpoint::op
