// Command-line flags of spawnpoint-operator. Parsing is pure; errors name the flag and what
// is allowed (the caller prints them and exits 2).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace spawnpoint::op {

struct OperatorOptions {
  bool help = false;
  bool version = false;    // --version: print the version and exit
  std::string kubeconfig;  // "": in-cluster, else $KUBECONFIG or ~/.kube/config
  std::string context;
  // --namespace a,b: the namespaces whose TrainingJobs (and their pods and services) are
  // watched, one watch each; empty: every namespace.
  std::vector<std::string> namespaces;
  bool leader_elect = false;
  // "": the one --namespace, else (every namespace or several) the config's namespace.
  std::string leader_elect_namespace;
  std::string leader_elect_name = "spawnpoint-operator";
  Clock::Duration lease_duration = std::chrono::seconds(15);
  Clock::Duration renew_deadline = std::chrono::seconds(10);
  Clock::Duration retry_period = std::chrono::seconds(2);
  std::string identity;                // "": hostname_pid
  std::string metrics_addr = ":8080";  // "": off (the flag also takes "off" and "0")
  std::string health_addr = ":8081";   // "": off (the flag also takes "off" and "0")
  std::string agent_image = "ghcr.io/spawnpoint/agent:latest";
  std::string agent_path;   // non-empty: the trainer images have the agent here
  std::string master_addr;  // non-empty: MASTER_ADDR for every job
  int agent_status_port = 9400;
  // The key each job's status token is derived from (common/status_token.h): a file; "": a
  // random key per process (tokens change on restart); "off": no status tokens.
  std::string status_token_key_file;
  // node 0's agent's gang channel (restartPolicy.mode InPlace); 0: each job's rendezvous
  // port + 1.
  int agent_gang_port = 0;
  int max_concurrent_reconciles = 4;
  Clock::Duration pending_timeout = std::chrono::minutes(5);
  // A create the namespace's ResourceQuota refused: tried again after quota_retry, backing off
  // to quota_retry_max (quota_policy.h), and on every change of a ResourceQuota there when
  // watch_quotas.
  Clock::Duration quota_retry = std::chrono::seconds(5);
  Clock::Duration quota_retry_max = std::chrono::seconds(60);
  bool watch_quotas = true;
  Clock::Duration utilisation_interval = std::chrono::seconds(30);  // 0: off
  // In-place gangs' agents are read this often (0: off; their restarts then show only when
  // the job ends).
  Clock::Duration gang_status_interval = std::chrono::milliseconds(500);
  Clock::Duration resync_period{0};
  double kube_api_qps = 50;
  int kube_api_burst = 100;
  std::string log_level = "info";
  // Test hook: exit abruptly (as if killed) right after creating this many pods; 0: never.
  int crash_after_pod_creates = 0;
};

StatusOr<OperatorOptions> ParseOperatorArgs(const std::vector<std::string>& args);
std::string OperatorUsage();

// The Lease's namespace: --leader-elect-namespace, else the one namespace watched, else (every
// namespace or several, none of which is the obvious home) the config's namespace.
std::string LeaseNamespace(const OperatorOptions& options, const std::string& config_namespace);

// --namespace's value: "" is every namespace (an empty list), else names separated by commas,
// each a DNS label (RFC 1123, at most 63 characters), none twice.
StatusOr<std::vector<std::string>> ParseNamespaceList(const std::string& text);

// Flag setters both processes use: --namespace (ParseNamespaceList) and --log-level (debug,
// info, warning or error); errors are prefixed with `flag`.
Status SetNamespaceFlag(const std::string& flag, const std::string& value,
                        std::vector<std::string>* namespaces);
Status SetLogLevelFlag(const std::string& flag, const std::string& value, std::string* level);

// "500ms", "2s", "1.5m", "1h"; a bare number is seconds.
StatusOr<Clock::Duration> ParseDuration(const std::string& text);

}  // namespace spawnpoint::op
