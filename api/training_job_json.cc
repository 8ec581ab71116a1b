// TrainingJobToJson: a TrainingJob written back as the JSON object the operator applies and
// `spawnpoint-agent plan` prints, every default filled in (training_job.cc decodes).
#include "api/training_job.h"

namespace spawnpoint::api {

using nlohmann::json;

json TrainingJobToJson(const TrainingJob& job) {
  const TrainingJobSpec& s = job.spec;
  json metadata = job.metadata.is_object() ? job.metadata : json::object();
  metadata["name"] = job.name;
  // Left out when defaulted and absent, so "kubectl apply -n other" still applies.
  if (metadata.contains("namespace") || job.namespace_ != "default") {
    metadata["namespace"] = job.namespace_;
  }

  json loader = {
      {"workersPerRank",
       s.loader.workers_per_rank ? json(*s.loader.workers_per_rank) : json("auto")},
      {"prefetchFactor", s.loader.prefetch_factor},
      {"persistentWorkers", s.loader.persistent_workers},
      {"pinMemory", s.loader.pin_memory},
      {"timeoutSeconds", s.loader.timeout_seconds},
      {"seed", s.loader.seed},
      {"startMethod", s.loader.start_method},
      {"workerCommand", s.loader.worker_command},
      {"pythonPool", s.loader.python_pool},
      {"preloadModules", s.loader.preload_modules},
  };
  json restart = {
      {"mode", RestartModeName(s.restart_policy.mode)},
      {"maxRestarts", s.restart_policy.max_restarts},
      {"backoffSeconds", s.restart_policy.backoff_seconds},
      {"resetAfterSeconds", s.restart_policy.reset_after_seconds},
      {"retryableExitCodes", s.restart_policy.retryable_exit_codes},
      {"standby", s.restart_policy.standby},
  };
  if (!s.restart_policy.retry_on_exit_codes.empty() || !s.restart_policy.retry_on_causes.empty()) {
    json retry_on = json::array();
    for (int code : s.restart_policy.retry_on_exit_codes) retry_on.push_back(code);
    for (const std::string& cause : s.restart_policy.retry_on_causes) retry_on.push_back(cause);
    restart["retryOn"] = retry_on;
  }
  const RunPolicy& r = s.run_policy;
  json run_policy = {
      {"suspend", r.suspend},
      {"activeDeadlineSeconds",
       r.active_deadline_seconds ? json(*r.active_deadline_seconds) : json()},
      {"ttlSecondsAfterFinished",
       r.ttl_seconds_after_finished ? json(*r.ttl_seconds_after_finished) : json()},
      {"cleanPodPolicy", CleanPodPolicyName(r.clean_pod_policy)},
  };
  json spec = {
      {"nodes", s.nodes},
      {"gpusPerNode", s.gpus_per_node},
      {"procsPerNode", s.procs_per_node},
      {"gpuResource", s.gpu_resource},
      {"gpuAssignment", GpuAssignmentName(s.gpu_assignment)},
      {"backend", BackendName(s.backend)},
      {"template", s.pod_template},
      {"loader", loader},
      {"restartPolicy", restart},
      {"rendezvous", {{"port", s.rendezvous_port}}},
      {"shmSize", s.shm_size},
      {"runPolicy", run_policy},
      {"stallPolicy", StallPolicyJson(s.stall_policy)},
      {"scheduling", SchedulingJson(s.scheduling)},
  };
  json out = {
      {"apiVersion", kApiVersion},
      {"kind", kKind},
      {"metadata", metadata},
      {"spec", spec},
  };
  if (!job.status.is_null()) out["status"] = job.status;
  return out;
}

}  // namespace spawnpoint::api
