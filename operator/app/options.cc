#include "operator/app/options.h"

#include "api/field_reader.h"
#include "common/flags.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>

namespace spawnpoint::op {

StatusOr<Clock::Duration> ParseDuration(const std::string& text) {
  size_t unit = text.find_first_not_of("0123456789.");
  std::string number = text.substr(0, unit);
  std::string suffix = unit == std::string::npos ? "" : text.substr(unit);
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) throw std::invalid_argument("trailing");
  } catch (...) {
    return InvalidArgument("expected a duration such as 500ms, 10s, 5m or 1h, got \"" + text +
                           "\"");
  }
  double seconds = 0;
  if (suffix.empty() || suffix == "s") {
    seconds = value;
  } else if (suffix == "ms") {
    seconds = value / 1000;
  } else if (suffix == "m") {
    seconds = value * 60;
  } else if (suffix == "h") {
    seconds = value * 3600;
  } else {
    return InvalidArgument("expected a duration such as 500ms, 10s, 5m or 1h, got \"" + text +
                           "\"");
  }
  return std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(seconds));
}

std::string OperatorUsage() {
  return R"(usage: spawnpoint-operator [flags]

Turns TrainingJobs (spawnpoint.dev/v1alpha1) into gangs of node pods that run the
spawnpoint agent, restarts the gang when a rank fails, and keeps their status true.
`spawnpoint-operator status-watchdog --help`: the process that marks their status stale
while no operator runs.

flags:
  --kubeconfig PATH               kubeconfig to use (default: in-cluster, else $KUBECONFIG
                                  or ~/.kube/config)
  --context NAME                  kubeconfig context (default: current)
  --namespace NS[,NS...]          watch only these namespaces, one watch each (default:
                                  every namespace); a namespaced Role in each is enough
  --leader-elect                  run as one of several replicas: only the Lease holder acts
  --leader-elect-namespace NS     namespace of the Lease (default: --namespace when it names
                                  one, else the kubeconfig's namespace)
  --leader-elect-name NAME        name of the Lease (default spawnpoint-operator)
  --leader-elect-lease-duration D followers wait this long before taking over (default 15s)
  --leader-elect-renew-deadline D the leader gives up if it cannot renew this long (10s)
  --leader-elect-retry-period D   how often to try to acquire or renew (2s)
  --identity ID                   this replica's identity (default hostname_pid)
  --metrics-addr ADDR             serve /metrics on ADDR (default :8080; off disables)
  --health-addr ADDR              serve /healthz and /readyz on ADDR (default :8081; off
                                  disables)
  --agent-image IMAGE             image the agent is copied from by an init container
                                  (default ghcr.io/spawnpoint/agent:latest)
  --agent-path PATH               the trainer images already have the agent at PATH: no init
                                  container (a job's spawnpoint.dev/agent-path annotation
                                  does the same per job)
  --master-addr ADDR              MASTER_ADDR for every job instead of <job>-node-0.<job>
                                  (a job's spawnpoint.dev/master-addr annotation wins)
  --agent-status-port P           the agents' status port (default 9400)
  --status-token-key-file PATH    the key each job's status token is derived from (at least
                                  32 bytes): the agents serve their log lines only to the
                                  token's holders, this operator and the job's own pods
                                  (default: a random key, so tokens change when the operator
                                  restarts; off: no tokens, log lines on the pods' loopback only)
  --agent-gang-port P             where node 0's agent of a job that restarts in place
                                  (restartPolicy.mode InPlace) serves the gang (default:
                                  the job's rendezvous port + 1)
  --max-concurrent-reconciles N   workers reconciling different jobs at once (default 4)
  --pending-timeout D             report pods Pending longer than D (default 5m)
  --quota-retry D, --quota-retry-max D
                                  a pod create the namespace's ResourceQuota refused is tried
                                  again after D, backing off to the max (default 5s and 1m)
  --watch-resource-quotas[=false] and whenever a ResourceQuota of the namespace changes
                                  (default true; needs list and watch on resourcequotas)
  --utilisation-interval D        read running pods' agent status every D (default 30s; 0 off)
  --gang-status-interval D        read the agents of jobs that restart in place every D, to
                                  mirror their restarts (default 500ms; 0 off)
  --resync-period D               reconcile every job again every D (default 0: events only)
  --kube-api-qps Q, --kube-api-burst B
                                  client-side rate limit (default 50 and 100)
  --log-level LEVEL               debug, info, warning or error (default info)
  --version                       print the version and exit
  -h, --help                      this text
)";
}

std::string LeaseNamespace(const OperatorOptions& o, const std::string& config_namespace) {
  if (!o.leader_elect_namespace.empty()) return o.leader_elect_namespace;
  if (o.namespaces.size() == 1) return o.namespaces[0];
  return config_namespace;
}

StatusOr<std::vector<std::string>> ParseNamespaceList(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    std::string name = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (name.size() > 63 || !api::IsDnsLabel(name, /*first_may_be_digit=*/true)) {
      return InvalidArgument(
          "namespace " + api::Quote(name) + " in " + api::Quote(text) +
          " is not a DNS label (lowercase letters, digits and '-', starting and ending with a "
          "letter or digit, at most 63 characters); give names separated by commas, or \"\" "
          "for every namespace");
    }
    if (std::find(out.begin(), out.end(), name) != out.end()) {
      return InvalidArgument("namespace " + api::Quote(name) + " is listed twice in " +
                             api::Quote(text));
    }
    out.push_back(std::move(name));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

Status SetNamespaceFlag(const std::string& flag, const std::string& value,
                        std::vector<std::string>* namespaces) {
  auto parsed = ParseNamespaceList(value);
  if (!parsed.ok()) return parsed.status().WithPrefix(flag);
  *namespaces = std::move(*parsed);
  return Status::Ok();
}

Status SetLogLevelFlag(const std::string& flag, const std::string& value, std::string* level) {
  if (value != "debug" && value != "info" && value != "warning" && value != "error") {
    return InvalidArgument(flag + ": expected debug, info, warning or error, got \"" + value +
                           "\"");
  }
  *level = value;
  return Status::Ok();
}

StatusOr<OperatorOptions> ParseOperatorArgs(const std::vector<std::string>& args) {
  OperatorOptions o;
  using Setter = std::function<Status(const std::string& flag, const std::string& value)>;
  auto str = [](std::string* field) -> Setter {
    return [field](const std::string&, const std::string& v) {
      *field = v;
      return Status::Ok();
    };
  };
  auto integer = [](int* field, int min, int max) -> Setter {
    return [=](const std::string& flag, const std::string& v) {
      SP_ASSIGN_OR_RETURN(long long n, ParseIntFlag(flag, v, min, max));
      *field = static_cast<int>(n);
      return Status::Ok();
    };
  };
  auto duration = [](Clock::Duration* field, bool allow_zero) -> Setter {
    return [=](const std::string& flag, const std::string& v) {
      auto d = ParseDuration(v);
      if (!d.ok()) return d.status().WithPrefix(flag);
      if (!allow_zero && *d <= Clock::Duration::zero()) {
        return InvalidArgument(flag + ": must be > 0, got \"" + v + "\"");
      }
      *field = *d;
      return Status::Ok();
    };
  };
  const std::map<std::string, Setter> valued = {
      {"--kubeconfig", str(&o.kubeconfig)},
      {"--context", str(&o.context)},
      {"--namespace",
       [&](const std::string& flag, const std::string& v) {
         return SetNamespaceFlag(flag, v, &o.namespaces);
       }},
      {"--leader-elect-namespace", str(&o.leader_elect_namespace)},
      {"--leader-elect-name", str(&o.leader_elect_name)},
      {"--leader-elect-lease-duration", duration(&o.lease_duration, false)},
      {"--leader-elect-renew-deadline", duration(&o.renew_deadline, false)},
      {"--leader-elect-retry-period", duration(&o.retry_period, false)},
      {"--identity", str(&o.identity)},
      {"--metrics-addr", str(&o.metrics_addr)},
      {"--health-addr", str(&o.health_addr)},
      {"--agent-image", str(&o.agent_image)},
      {"--agent-path", str(&o.agent_path)},
      {"--master-addr", str(&o.master_addr)},
      {"--agent-status-port", integer(&o.agent_status_port, 1, 65535)},
      {"--status-token-key-file", str(&o.status_token_key_file)},
      {"--agent-gang-port", integer(&o.agent_gang_port, 1, 65535)},
      {"--max-concurrent-reconciles", integer(&o.max_concurrent_reconciles, 1, 256)},
      {"--pending-timeout", duration(&o.pending_timeout, false)},
      {"--quota-retry", duration(&o.quota_retry, false)},
      {"--quota-retry-max", duration(&o.quota_retry_max, false)},
      {"--utilisation-interval", duration(&o.utilisation_interval, true)},
      {"--gang-status-interval", duration(&o.gang_status_interval, true)},
      {"--resync-period", duration(&o.resync_period, true)},
      {"--kube-api-qps",
       [&](const std::string& flag, const std::string& v) {
         try {
           size_t used = 0;
           o.kube_api_qps = std::stod(v, &used);
           if (used == v.size() && o.kube_api_qps >= 0) return Status::Ok();
         } catch (...) {
         }
         return InvalidArgument(flag + ": expected a number >= 0 (0: no limit), got \"" + v + "\"");
       }},
      {"--kube-api-burst", integer(&o.kube_api_burst, 1, 1000000)},
      {"--log-level", [&](const std::string& flag,
                          const std::string& v) { return SetLogLevelFlag(flag, v, &o.log_level); }},
      {"--crash-after-pod-creates", integer(&o.crash_after_pod_creates, 0, 1000000)},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const FlagArg arg = SplitFlag(args[i]);
    const std::string& flag = arg.name;
    const bool has_value = arg.has_value;
    const std::string& value = arg.value;
    if (flag == "-h" || flag == "--help") {
      o.help = true;
      return o;
    }
    if (flag == "--version") {
      o.version = true;
      return o;
    }
    if (flag == "--watch-resource-quotas") {
      if (has_value && value != "true" && value != "false") {
        return InvalidArgument("--watch-resource-quotas: expected true or false, got \"" + value +
                               "\"");
      }
      o.watch_quotas = !has_value || value == "true";
      continue;
    }
    if (flag == "--leader-elect") {
      if (has_value && value != "true" && value != "false") {
        return InvalidArgument("--leader-elect: expected true or false, got \"" + value + "\"");
      }
      o.leader_elect = !has_value || value == "true";
      continue;
    }
    auto it = valued.find(flag);
    if (it == valued.end()) return InvalidArgument("unknown flag \"" + flag + "\"; see --help");
    SP_ASSIGN_OR_RETURN(std::string flag_value, FlagValue(arg, args, &i));
    SP_RETURN_IF_ERROR(it->second(flag, flag_value));
  }
  // "off" turns an address off, as the agent's --metrics-addr says it; "0" and "" still do.
  for (std::string* addr : {&o.metrics_addr, &o.health_addr}) {
    if (*addr == "off" || *addr == "0") addr->clear();
  }
  if (o.quota_retry_max < o.quota_retry) {
    return InvalidArgument("--quota-retry-max must be at least --quota-retry");
  }
  if (o.leader_elect) {
    if (!(o.lease_duration > o.renew_deadline)) {
      return InvalidArgument(
          "--leader-elect-lease-duration must be longer than --leader-elect-renew-deadline");
    }
    if (!(o.renew_deadline * 10 > o.retry_period * 12)) {
      return InvalidArgument(
          "--leader-elect-renew-deadline must be longer than 1.2 x --leader-elect-retry-period");
    }
  }
  return o;
}

}  // namespace spawnpoint::op
