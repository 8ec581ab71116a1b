#include "agent/loader/dataset.h"

#include <exception>
#include <map>
#include <mutex>

namespace spawnpoint::loader {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, DatasetFactory> factories;
};

// A function-local static, so registrations from other translation units' static
// initialisers find it constructed whatever the initialisation order.
Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t DeriveSeed(uint64_t base_seed, int rank, int worker, int64_t epoch) {
  uint64_t h = SplitMix64(base_seed);
  h = SplitMix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(rank)));
  h = SplitMix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(worker)));
  h = SplitMix64(h ^ static_cast<uint64_t>(epoch));
  return h;
}

bool RegisterDataset(const std::string& name, DatasetFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.emplace(name, std::move(factory)).second;
}

std::vector<std::string> RegisteredDatasets() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

StatusOr<std::unique_ptr<Dataset>> CreateDataset(const std::string& name, const std::string& arg) {
  DatasetFactory factory;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : RegisteredDatasets()) known += (known.empty() ? "" : ", ") + n;
    return NotFound("dataset \"" + name + "\" is not registered in this program (registered: " +
                    (known.empty() ? "none" : known) +
                    "); register it with SPAWNPOINT_REGISTER_DATASET in a source file linked "
                    "into the executable");
  }
  try {
    StatusOr<std::unique_ptr<Dataset>> made = factory(arg);
    if (!made.ok()) return made.status().WithPrefix("dataset \"" + name + "\"");
    if (*made == nullptr) return Internal("dataset \"" + name + "\": the factory returned null");
    return made;
  } catch (const std::exception& e) {
    return Internal("dataset \"" + name + "\": the factory threw: " + e.what());
  } catch (...) {
    return Internal("dataset \"" + name + "\": the factory threw a non-standard exception");
  }
}

}  // namespace spawnpoint::loader
