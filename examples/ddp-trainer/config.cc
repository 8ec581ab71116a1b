#include "examples/ddp-trainer/config.h"

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <optional>

namespace spawnpoint::trainer {
namespace {

std::optional<std::int64_t> ParseInt(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> ParseDouble(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

Status IntFlag(const std::string& name, const std::string& value, std::int64_t min,
               std::int64_t max, std::int64_t* out) {
  auto v = ParseInt(value);
  if (!v || *v < min || *v > max) {
    return InvalidArgument("flag " + name + "=" + value + " must be an integer in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  *out = *v;
  return Status::Ok();
}

template <typename T>
Status IntFlagAs(const std::string& name, const std::string& value, std::int64_t min,
                 std::int64_t max, T* out) {
  std::int64_t v = 0;
  SP_RETURN_IF_ERROR(IntFlag(name, value, min, max, &v));
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status PositiveDoubleFlag(const std::string& name, const std::string& value, bool allow_zero,
                          double* out) {
  auto v = ParseDouble(value);
  if (!v || *v < 0 || (!allow_zero && *v == 0)) {
    return InvalidArgument("flag " + name + "=" + value + " must be a " +
                           (allow_zero ? "non-negative" : "positive") + " number");
  }
  *out = *v;
  return Status::Ok();
}

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

StatusOr<std::string> Required(const Getenv& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') {
    return InvalidArgument(std::string("environment variable ") + name +
                           " is not set (launch with torchrun or spawnpoint-agent)");
  }
  return std::string(v);
}

StatusOr<int> EnvInt(const char* name, const std::string& value, std::int64_t min,
                     std::int64_t max) {
  auto v = ParseInt(value);
  if (!v || *v < min || *v > max) {
    return InvalidArgument(std::string("environment variable ") + name + "=" + value +
                           " must be an integer in [" + std::to_string(min) + ", " +
                           std::to_string(max) + "]");
  }
  return static_cast<int>(*v);
}

StatusOr<int> RequiredInt(const Getenv& getenv, const char* name, std::int64_t min,
                          std::int64_t max) {
  SP_ASSIGN_OR_RETURN(std::string s, Required(getenv, name));
  return EnvInt(name, s, min, max);
}

}  // namespace

const char* Usage() {
  return R"(usage: spawnpoint-example-trainer [flags]

A data-parallel trainer for spawnpoint: a small MLP regresses a fixed random teacher
network on a synthetic data set, every rank trains on its own shard and gradients are
averaged with bucketed gloo allreduce. Launch it like any torchrun trainer: it reads
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
TORCHELASTIC_RESTART_COUNT (optional, default 0) from the environment.

flags:
  --epochs N            epochs (default 3)
  --steps-per-epoch N   optimiser steps per epoch (default 50)
  --batch-size N        samples per rank per step (default 32)
  --lr X                SGD learning rate (default 0.05)
  --momentum X          SGD momentum (default 0.9)
  --hidden N            width of the two hidden layers (default 256)
  --bucket-bytes N      gradient bucket size cap for allreduce (default 1048576)
  --seed N              data set seed, the same on every rank (default 1234)
  --data loader|memory  batches from spawnpoint's loader (default: spawned loader workers
                        when the agent runs a pool for the rank, else loaded in-process)
                        or from a tensor built at start-up
  --decode-passes N     loader data: smoothing passes per sample, its CPU cost (default 16)
  --timeout-seconds N   rendezvous and collective timeout (default 300)
  --fail-at-step N      fault injection: at the start of global step N (0-based, counted
                        across epochs) exit with --fail-exit-code or raise --fail-signal;
                        only on --fail-rank and only when TORCHELASTIC_RESTART_COUNT is 0
  --fail-exit-code C    exit code for --fail-at-step (default 1)
  --fail-signal S       signal number to raise for --fail-at-step instead of exiting
  --fail-rank R         the rank that fails (default 0)
  --hang-at-step N      stall injection: at the start of global step N --fail-rank sleeps
                        forever in HangForever() (only when TORCHELASTIC_RESTART_COUNT is 0)
  --timing              print "timing rank=R event=E unix_ns=T" lines (start, pg_ready,
                        first_allreduce, end, and fail just before --fail-at-step fires)
  --help                this text

environment (optional): TORCHELASTIC_USE_AGENT_STORE=True (the launcher hosts the TCPStore),
SPAWNPOINT_BACKEND=auto|gloo|nccl, OMP_NUM_THREADS (default 1 thread per rank),
GLOO_SOCKET_IFNAME.

output: rank 0 prints one progress line per epoch; every rank ends with
  final rank=R loss=L params=HEX
where L is the rank's mean loss over its last epoch and HEX the FNV-1a 64 hash of all
parameters (identical on every rank when data parallelism is correct).
)";
}

StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  bool exit_code_set = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    if (name == "--help" || name == "-h") {
      f.help = true;
      continue;
    }
    if (name == "--timing") {
      f.timing = true;
      continue;
    }
    if (name.rfind("--", 0) != 0) {
      return InvalidArgument("unexpected argument " + name + " (see --help)");
    }
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    static const char* const kValued[] = {"--epochs",          "--steps-per-epoch",
                                          "--batch-size",      "--lr",
                                          "--momentum",        "--hidden",
                                          "--bucket-bytes",    "--seed",
                                          "--timeout-seconds", "--fail-at-step",
                                          "--fail-exit-code",  "--fail-signal",
                                          "--fail-rank",       "--data",
                                          "--decode-passes",   "--hang-at-step"};
    bool known = false;
    for (const char* k : kValued) known = known || name == k;
    if (!known) return InvalidArgument("unknown flag " + name + " (see --help)");
    if (!value) {
      if (i + 1 >= args.size()) return InvalidArgument("flag " + name + " needs a value");
      value = args[++i];
    }
    const std::string& v = *value;
    if (name == "--epochs") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, 1000000, &f.epochs));
    } else if (name == "--steps-per-epoch") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, 100000000, &f.steps_per_epoch));
    } else if (name == "--batch-size") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, 1 << 20, &f.batch_size));
    } else if (name == "--lr") {
      SP_RETURN_IF_ERROR(PositiveDoubleFlag(name, v, false, &f.lr));
    } else if (name == "--momentum") {
      SP_RETURN_IF_ERROR(PositiveDoubleFlag(name, v, true, &f.momentum));
    } else if (name == "--hidden") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, 1 << 16, &f.hidden));
    } else if (name == "--bucket-bytes") {
      SP_RETURN_IF_ERROR(IntFlag(name, v, 1, std::int64_t{1} << 40, &f.bucket_bytes));
    } else if (name == "--seed") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 0, std::numeric_limits<std::int64_t>::max(), &f.seed));
    } else if (name == "--timeout-seconds") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, 7 * 24 * 3600, &f.timeout_seconds));
    } else if (name == "--fail-at-step") {
      SP_RETURN_IF_ERROR(
          IntFlag(name, v, 0, std::numeric_limits<std::int64_t>::max(), &f.fail_at_step));
    } else if (name == "--hang-at-step") {
      SP_RETURN_IF_ERROR(
          IntFlag(name, v, 0, std::numeric_limits<std::int64_t>::max(), &f.hang_at_step));
    } else if (name == "--fail-exit-code") {
      // 0 would make a "failure" indistinguishable from success.
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, 255, &f.fail_exit_code));
      exit_code_set = true;
    } else if (name == "--fail-signal") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 1, SIGRTMAX, &f.fail_signal));
    } else if (name == "--fail-rank") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 0, kIntMax, &f.fail_rank));
    } else if (name == "--data") {
      if (v != "loader" && v != "memory") {
        return InvalidArgument("flag --data: expected loader or memory, got \"" + v + "\"");
      }
      f.data = v;
    } else if (name == "--decode-passes") {
      SP_RETURN_IF_ERROR(IntFlagAs(name, v, 0, 100000, &f.decode_passes));
    }
  }
  if (exit_code_set && f.fail_signal != 0) {
    return InvalidArgument("flags --fail-exit-code and --fail-signal are mutually exclusive");
  }
  return f;
}

StatusOr<RankEnv> ReadRankEnv(const Getenv& getenv, bool nccl_supported) {
  RankEnv e;
  SP_ASSIGN_OR_RETURN(e.world_size, RequiredInt(getenv, "WORLD_SIZE", 1, kIntMax));
  SP_ASSIGN_OR_RETURN(e.rank, RequiredInt(getenv, "RANK", 0, e.world_size - 1));
  SP_ASSIGN_OR_RETURN(e.local_world_size, RequiredInt(getenv, "LOCAL_WORLD_SIZE", 1, e.world_size));
  SP_ASSIGN_OR_RETURN(e.local_rank, RequiredInt(getenv, "LOCAL_RANK", 0, e.local_world_size - 1));
  SP_ASSIGN_OR_RETURN(e.master_addr, Required(getenv, "MASTER_ADDR"));
  SP_ASSIGN_OR_RETURN(e.master_port, RequiredInt(getenv, "MASTER_PORT", 1, 65535));
  if (const char* v = getenv("TORCHELASTIC_RESTART_COUNT"); v != nullptr && *v != '\0') {
    SP_ASSIGN_OR_RETURN(e.restart_count, EnvInt("TORCHELASTIC_RESTART_COUNT", v, 0, kIntMax));
  }
  if (const char* v = getenv("TORCHELASTIC_USE_AGENT_STORE"); v != nullptr) {
    // torch.distributed compares against str(True); accept the obvious spellings too.
    std::string s = v;
    e.use_agent_store = s == "True" || s == "true" || s == "1";
  }
  if (const char* v = getenv("SPAWNPOINT_BACKEND"); v != nullptr && *v != '\0') {
    std::string s = v;
    if (s == "nccl") {
      if (!nccl_supported) {
        return InvalidArgument(
            "environment variable SPAWNPOINT_BACKEND=nccl needs CUDA and NCCL, which this "
            "build of the trainer (CPU libtorch) does not have; use gloo or auto");
      }
      e.backend = "nccl";
    } else if (s == "gloo") {
      e.backend = "gloo";
    } else if (s == "auto") {
      e.backend = nccl_supported ? "nccl" : "gloo";
    } else {
      return InvalidArgument("environment variable SPAWNPOINT_BACKEND=" + s +
                             " must be one of auto, gloo, nccl");
    }
  }
  if (const char* v = getenv("OMP_NUM_THREADS"); v != nullptr && *v != '\0') {
    e.omp_num_threads_set = true;
  }
  if (const char* v = getenv("GLOO_SOCKET_IFNAME"); v != nullptr) e.gloo_socket_ifname = v;
  return e;
}

Status CheckFlagsAgainstEnv(const Flags& flags, const RankEnv& env) {
  if (flags.fail_at_step < 0) return Status::Ok();
  if (flags.fail_rank >= env.world_size) {
    return InvalidArgument("flag --fail-rank=" + std::to_string(flags.fail_rank) +
                           " is not a rank of WORLD_SIZE=" + std::to_string(env.world_size));
  }
  std::int64_t total = std::int64_t{flags.epochs} * flags.steps_per_epoch;
  if (flags.fail_at_step >= total) {
    return InvalidArgument("flag --fail-at-step=" + std::to_string(flags.fail_at_step) +
                           " is past the last step (" + std::to_string(total - 1) + ")");
  }
  return Status::Ok();
}

}  // namespace spawnpoint::trainer
