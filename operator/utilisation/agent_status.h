// Reading a node agent's JSON status (GET http://<podIP>:<port>/status) and folding the
// pods' documents into a job's status.utilisation: GPU utilisation (mean over the GPUs
// that report it, gpus[].utilisation), data stall (mean over the ranks that are up of
// loader[].stats.dataStall) and samples per second (their sum): the document of the agent's
// /status endpoint. Pods that cannot be read are named in `error`, never fatal. The
// documents' "stall" (a rank that made no step for spec.stallPolicy's timeout) folds into
// the job's stall (JobStall); their progress[] (each rank's own work per step) into the job's
// straggler (JobStraggler), the slowest rank of the whole job, not only of one node.
// AgentStatusReader implementations must be thread-safe; the functions here are pure.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::op {

class AgentStatusReader {
 public:
  virtual ~AgentStatusReader() = default;
  // `token`: the job's status token (common/status_token.h), sent as a bearer token so the
  // agent serves its log lines too; "" for none.
  virtual StatusOr<nlohmann::json> Read(const std::string& pod_ip, int port,
                                        const std::string& token) = 0;
};

// Over plain HTTP with a per-read timeout.
class HttpAgentStatusReader : public AgentStatusReader {
 public:
  explicit HttpAgentStatusReader(std::chrono::milliseconds timeout = std::chrono::seconds(2))
      : timeout_(timeout) {}
  StatusOr<nlohmann::json> Read(const std::string& pod_ip, int port,
                                const std::string& token) override;

 private:
  const std::chrono::milliseconds timeout_;
};

struct PodReading {
  std::string pod;
  StatusOr<nlohmann::json> status;
};

// status.utilisation from one round of readings, stamped `updated`:
// {gpu?, dataStall?, samplesPerSecond?, pods, error?, updated}.
nlohmann::json AggregateUtilisation(const std::vector<PodReading>& readings,
                                    const std::string& updated);

// The job's stalled rank from one round of readings: of the documents whose "stall" is an
// object, the one silent longest (its peers on other nodes fall silent after it, waiting in
// a collective), then the lowest rank, with "pod" set to the pod it was read from. Null
// when every pod was read and none reports a stall; nullopt when some pod could not be read
// and none of the others reports one.
std::optional<nlohmann::json> JobStall(const std::vector<PodReading>& readings);

// The job's slowest rank and straggler from one round of readings.
struct JobStragglerReading {
  // The straggler: {rank, pod, ratio, busySeconds, peersBusySeconds, windowSteps, message},
  // or null when no rank of the job is one.
  nlohmann::json straggler;
  // The slowest rank's own work per step over the median of the others' (ratio above), 0
  // when fewer than two ranks have a figure yet (a full window of steps).
  double slowest_ratio = 0;
};

// Judges every rank of the job that has a figure (progress[].busySeconds, the median of its
// own work per step over its last api::kStragglerWindowSteps steps) together, as
// api/straggler.h says: the slowest against the median of all the others, whatever their
// node, is a straggler at `ratio` (spec.stallPolicy.stragglerRatio), and stays one down to
// the halfway ratio when `previous` (the last verdict, or status.straggler) named the same
// rank and pod. "pod" is the pod the rank's document was read from. nullopt when some pod
// could not be read: its ranks might be the slowest.
std::optional<JobStragglerReading> JobStraggler(const std::vector<PodReading>& readings,
                                                double ratio, const nlohmann::json& previous);

}  // namespace spawnpoint::op
