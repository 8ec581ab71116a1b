#include "operator/app/watchdog_options.h"

#include <functional>
#include <map>

#include "common/flags.h"
#include "operator/app/options.h"

namespace spawnpoint::op {

std::string WatchdogUsage() {
  return R"(usage: spawnpoint-operator status-watchdog --lease-namespace NS [flags]

Marks TrainingJobs' status stale (condition StatusStale=True, reason OperatorNotRunning, and
a Warning event) while no operator runs: when the operator's leader-election Lease has not
changed for --stale-after. The operator sets the condition False when it runs again. Run it
apart from the operator (its own Deployment: the chart's statusWatchdog), with leases get,
trainingjobs list, trainingjobs/status patch and events create.

flags:
  --kubeconfig PATH          kubeconfig to use (default: in-cluster, else $KUBECONFIG or
                             ~/.kube/config)
  --context NAME             kubeconfig context (default: current)
  --lease-namespace NS       the operator's Lease's namespace (its --leader-elect-namespace;
                             required)
  --lease-name NAME          the Lease's name (its --leader-elect-name; default
                             spawnpoint-operator)
  --namespace NS[,NS...]     the namespaces of the jobs to mark (the operator's --namespace;
                             default: every namespace)
  --stale-after D            the Lease unchanged this long means no operator runs (default
                             45s; longer than the operator's lease duration, 15s by default)
  --interval D               how often the Lease is read (default 5s)
  --identity ID              the events' reporting instance (default: hostname_pid)
  --log-level LEVEL          debug, info, warning or error (default info)
  -h, --help                 this text
)";
}

StatusOr<WatchdogOptions> ParseWatchdogArgs(const std::vector<std::string>& args) {
  WatchdogOptions o;
  using Setter = std::function<Status(const std::string& flag, const std::string& value)>;
  auto str = [](std::string* field) -> Setter {
    return [field](const std::string& flag, const std::string& v) {
      if (v.empty()) return InvalidArgument(flag + ": must not be empty");
      *field = v;
      return Status::Ok();
    };
  };
  auto duration = [](Clock::Duration* field) -> Setter {
    return [=](const std::string& flag, const std::string& v) {
      auto d = ParseDuration(v);
      if (!d.ok()) return d.status().WithPrefix(flag);
      if (*d <= Clock::Duration::zero()) {
        return InvalidArgument(flag + ": must be > 0, got \"" + v + "\"");
      }
      *field = *d;
      return Status::Ok();
    };
  };
  const std::map<std::string, Setter> valued = {
      {"--kubeconfig", str(&o.kubeconfig)},
      {"--context", str(&o.context)},
      {"--lease-namespace", str(&o.lease_namespace)},
      {"--lease-name", str(&o.lease_name)},
      {"--namespace",
       [&](const std::string& flag, const std::string& v) {
         return SetNamespaceFlag(flag, v, &o.namespaces);
       }},
      {"--stale-after", duration(&o.stale_after)},
      {"--interval", duration(&o.interval)},
      {"--identity", str(&o.identity)},
      {"--log-level", [&](const std::string& flag,
                          const std::string& v) { return SetLogLevelFlag(flag, v, &o.log_level); }},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const FlagArg arg = SplitFlag(args[i]);
    if (arg.name == "-h" || arg.name == "--help") {
      o.help = true;
      return o;
    }
    auto it = valued.find(arg.name);
    if (it == valued.end()) {
      return InvalidArgument("status-watchdog: unknown flag \"" + arg.name + "\"; see --help");
    }
    SP_ASSIGN_OR_RETURN(std::string value, FlagValue(arg, args, &i));
    SP_RETURN_IF_ERROR(it->second(arg.name, value));
  }
  if (o.lease_namespace.empty()) {
    return InvalidArgument(
        "status-watchdog: --lease-namespace is required (the operator's "
        "--leader-elect-namespace, where its Lease is)");
  }
  if (o.interval * 2 > o.stale_after) {
    return InvalidArgument(
        "status-watchdog: --stale-after must be at least twice --interval (the Lease is read "
        "every --interval)");
  }
  return o;
}

}  // namespace spawnpoint::op
