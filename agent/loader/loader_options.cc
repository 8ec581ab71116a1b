#include "agent/loader/loader_options.h"

#include <errno.h>
#include <stdlib.h>

#include "agent/loader/contract.h"
#include "agent/loader/shm_ring.h"

namespace spawnpoint::loader {
namespace {

StatusOr<int64_t> ParseInt(const std::string& name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0') {
    return InvalidArgument(name + "=\"" + text + "\" is not an integer");
  }
  return static_cast<int64_t>(v);
}

// Fills `field` from the integer variable `name`, else with `fallback`, unless it is set.
template <typename T>
Status FillFromEnv(std::optional<T>& field, const EnvLookup& env, const char* name,
                   int64_t fallback) {
  if (field) return Status::Ok();
  int64_t n = fallback;
  if (auto v = env(name)) {
    SP_ASSIGN_OR_RETURN(n, ParseInt(name, *v));
  }
  field = static_cast<T>(n);
  return Status::Ok();
}

}  // namespace

std::optional<std::string> ProcessEnv(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

StatusOr<LoaderOptions> ResolveLoaderOptions(LoaderOptions o, const EnvLookup& env) {
  if (o.dataset.empty()) return InvalidArgument("loader: LoaderOptions::dataset is empty");
  if (o.batch_size < 1) return InvalidArgument("loader: batch_size must be at least 1");
  if (o.max_attempts < 1) return InvalidArgument("loader: max_attempts must be at least 1");
  if (o.pool_dir.empty()) o.pool_dir = env(kEnvPoolDir).value_or("");
  if (o.workers == kWorkersFromEnv) {
    auto w = env(kEnvWorkers);
    if (!o.pool_dir.empty() && env(kEnvAutoWorkers).value_or("") == "1") {
      o.workers = kAutoWorkers;
    } else if (!w) {
      o.workers = 0;
    } else if (*w == "auto") {
      o.workers = kAutoWorkers;
    } else {
      SP_ASSIGN_OR_RETURN(int64_t n, ParseInt(kEnvWorkers, *w));
      if (n < 0) return InvalidArgument(std::string(kEnvWorkers) + " must be >= 0 or auto");
      o.workers = static_cast<int>(n);
    }
  }
  if (o.workers < 0 && o.workers != kAutoWorkers) {
    return InvalidArgument("loader: workers must be >= 0, kAutoWorkers or kWorkersFromEnv");
  }
  SP_RETURN_IF_ERROR(FillFromEnv(o.prefetch_factor, env, kEnvPrefetchFactor, 2));
  if (*o.prefetch_factor < 1) return InvalidArgument("loader: prefetch_factor must be >= 1");
  if (!o.timeout) {
    auto v = env(kEnvTimeoutSeconds);
    if (v) {
      char* end = nullptr;
      double secs = strtod(v->c_str(), &end);
      if (*end != '\0' || secs < 0) {
        return InvalidArgument(std::string(kEnvTimeoutSeconds) + "=\"" + *v +
                               "\" is not a number of seconds");
      }
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
    } else {
      o.timeout = std::chrono::seconds(120);
    }
  }
  SP_RETURN_IF_ERROR(FillFromEnv(o.seed, env, kEnvSeed, 0));
  if (!o.slot_bytes) {
    if (auto v = env(kEnvSlotBytes)) {
      SP_ASSIGN_OR_RETURN(int64_t n, ParseInt(kEnvSlotBytes, *v));
      if (n <= 0) return InvalidArgument(std::string(kEnvSlotBytes) + " must be positive");
      o.slot_bytes = static_cast<size_t>(n);
    }
  }
  if (o.slot_bytes) o.slot_bytes = RoundUpToPages(*o.slot_bytes);
  SP_RETURN_IF_ERROR(FillFromEnv(o.rank, env, "RANK", 0));
  SP_RETURN_IF_ERROR(FillFromEnv(o.world_size, env, "WORLD_SIZE", 1));
  if (*o.world_size < 1 || *o.rank < 0 || *o.rank >= *o.world_size) {
    return InvalidArgument("loader: rank " + std::to_string(*o.rank) + " is outside world size " +
                           std::to_string(*o.world_size));
  }
  if (!o.cpus) {
    if (auto v = env(kEnvCpus)) {
      auto spec = ParseCpuSpec(*v);
      if (!spec.ok()) return spec.status().WithPrefix(kEnvCpus);
      o.cpus = spec->count;
    } else {
      o.cpus = AffinityCpuCount();
    }
  }
  if (*o.cpus < 1) o.cpus = 1;
  if (o.shm_dir.empty()) o.shm_dir = env(kEnvShmDir).value_or("/dev/shm");
  return o;
}

StatusOr<LoaderOptions> ResolveLoaderOptions(LoaderOptions options) {
  return ResolveLoaderOptions(std::move(options), ProcessEnv);
}

StatusOr<int> AgentPoolSize(const EnvLookup& env) {
  auto w = env(kEnvWorkers);
  if (!w) {
    return InvalidArgument(std::string("loader: ") + kEnvPoolDir + " is set but " + kEnvWorkers +
                           " (the pool's size) is not");
  }
  auto n = ParseInt(kEnvWorkers, *w);
  if (!n.ok() || *n < 1) {
    return InvalidArgument(std::string("loader: in a pool run by the agent ") + kEnvWorkers +
                           " must be the pool's size (>= 1), not \"" + *w + "\"");
  }
  return static_cast<int>(*n);
}

}  // namespace spawnpoint::loader
