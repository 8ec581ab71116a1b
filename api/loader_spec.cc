#include "api/loader_spec.h"

#include <algorithm>
#include <string>
#include <utility>

#include "api/field_reader.h"

namespace spawnpoint::api {
namespace {

using nlohmann::json;

// spec.loader.preloadModules: every Python loader worker imports each of them.
constexpr size_t kMaxPreloadModules = 32;

// "numpy" and "torchvision.transforms": identifiers (ASCII letters, digits and '_', not
// starting with a digit) separated by '.'.
bool IsDottedModuleName(std::string_view name) {
  bool start = true;  // at the start of an identifier
  for (char c : name) {
    if (c == '.') {
      if (start) return false;
      start = true;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      start = false;
    } else if (c >= '0' && c <= '9') {
      if (start) return false;
    } else {
      return false;
    }
  }
  return !start;
}

Status DecodePreloadModules(FieldReader& reader, const Field& field,
                            std::vector<std::string>* modules) {
  if (!field.value) return Status::Ok();
  const std::string what = "a list of at most " + std::to_string(kMaxPreloadModules) +
                           " Python module names (e.g. [torch, numpy])";
  if (!field.value->is_array()) return reader.WrongType(field, what);
  if (field.value->size() > kMaxPreloadModules) {
    return reader.Fail(field.path, "must hold at most " + std::to_string(kMaxPreloadModules) +
                                       " modules, got " + std::to_string(field.value->size()));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < field.value->size(); ++i) {
    Field item{&(*field.value)[i], field.path.Index(i)};
    if (!item.value->is_string()) {
      return reader.WrongType(item, "a Python module name (a string such as \"numpy\")");
    }
    std::string name = item.value->get<std::string>();
    if (!IsDottedModuleName(name)) {
      return reader.Fail(item.path,
                         "must be a Python module name: identifiers (letters, digits and '_', not "
                         "starting with a digit) separated by '.', such as \"torch\" or "
                         "\"torchvision.transforms\"; got " +
                             Quote(name));
    }
    auto earlier = std::find(out.begin(), out.end(), name);
    if (earlier != out.end()) {
      return reader.Fail(item.path, Quote(name) + " is listed twice (also at index " +
                                        std::to_string(earlier - out.begin()) +
                                        "); each module may appear once");
    }
    out.push_back(std::move(name));
  }
  *modules = std::move(out);
  return Status::Ok();
}

}  // namespace

Status DecodeLoaderSpec(FieldReader& reader, const Field& field, LoaderSpec* loader) {
  if (!field.value) return Status::Ok();
  SP_RETURN_IF_ERROR(
      reader.CheckObject(*field.value, field.path, "the loader settings", kLoaderFields));
  const json& l = *field.value;
  const FieldPath& path = field.path;

  Field workers = Get(l, path, "workersPerRank");
  if (workers.value && workers.value->is_string()) {
    if (*workers.value != "auto") {
      return reader.Fail(workers.path,
                         "must be an integer >= 0 or \"auto\", got " + Describe(*workers.value));
    }
    loader->workers_per_rank = std::nullopt;
  } else if (workers.value) {
    if (!workers.value->is_number())
      return reader.WrongType(workers, "an integer >= 0 or \"auto\"");
    int value = 0;
    SP_RETURN_IF_ERROR(reader.ReadInt(workers, 0, kIntMax, &value));
    loader->workers_per_rank = value;
  }
  SP_RETURN_IF_ERROR(
      reader.ReadInt(Get(l, path, "prefetchFactor"), 1, kIntMax, &loader->prefetch_factor));
  SP_RETURN_IF_ERROR(
      reader.ReadBool(Get(l, path, "persistentWorkers"), &loader->persistent_workers));
  SP_RETURN_IF_ERROR(reader.ReadBool(Get(l, path, "pinMemory"), &loader->pin_memory));
  SP_RETURN_IF_ERROR(
      reader.ReadInt(Get(l, path, "timeoutSeconds"), 1, kIntMax, &loader->timeout_seconds));

  Field seed = Get(l, path, "seed");
  if (seed.value) {
    if (seed.value->is_number_unsigned()) {
      loader->seed = seed.value->get<uint64_t>();
    } else {
      int64_t value = 0;
      SP_RETURN_IF_ERROR(reader.ReadInt64(seed, 0, kInt64Max, &value));
      loader->seed = static_cast<uint64_t>(value);
    }
  }

  Field start_method = Get(l, path, "startMethod");
  if (start_method.value && !start_method.value->is_string()) {
    return reader.WrongType(start_method, "\"spawn\"");
  }
  SP_RETURN_IF_ERROR(reader.ReadString(start_method, &loader->start_method));
  if (loader->start_method == "fork") {
    return reader.Fail(start_method.path,
                       "\"fork\" is not allowed: forking a process after it initialised CUDA/ROCm "
                       "corrupts the GPU context (and OpenMP thread pools); use \"spawn\"");
  }
  if (loader->start_method == "forkserver") {
    return reader.Fail(start_method.path,
                       "\"forkserver\" is not allowed: the agent starts every worker as a fresh "
                       "process; use \"spawn\"");
  }
  if (loader->start_method != "spawn") {
    return reader.Fail(start_method.path, "must be \"spawn\" (the only start method), got " +
                                              Quote(loader->start_method));
  }
  SP_RETURN_IF_ERROR(reader.ReadStringList(Get(l, path, "workerCommand"), &loader->worker_command));
  SP_RETURN_IF_ERROR(reader.ReadBool(Get(l, path, "pythonPool"), &loader->python_pool));
  return DecodePreloadModules(reader, Get(l, path, "preloadModules"), &loader->preload_modules);
}

}  // namespace spawnpoint::api
