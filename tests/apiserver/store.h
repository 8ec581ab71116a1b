// The object store behind the API test server: every resource, built-in or custom, is a
// JSON object kept under "<group>/<plural>" and "<namespace>/<name>". It implements the
// semantics clients depend on:
//   - one global resourceVersion counter, bumped by every write (no-op updates write
//     nothing); 409 Conflict on a stale resourceVersion; 409 AlreadyExists on create;
//   - uid, creationTimestamp, generation (bumped only when something other than metadata,
//     and status for resources with a status subresource, changes);
//   - status subresources: the main endpoint ignores status, /status ignores the rest;
//   - admission for custom resources: pruning of unknown fields (fieldValidation
//     Strict → 400, Warn → warnings, Ignore), schema defaulting and validation (422);
//   - finalizers and deletionTimestamp; ownerReference garbage collection with
//     Background, Foreground (foregroundDeletion finalizer, waits for dependents with
//     blockOwnerDeletion) and Orphan propagation; namespace deletion that empties the
//     namespace first; CRDs that register their resources when created;
//   - list with label/field selectors and limit/continue paging (keys in order, so pages
//     neither repeat nor skip objects when nothing changes); a continue token older than
//     the retained event window is 410 Expired;
//   - watch from a resourceVersion with the events retained in a window of the last N
//     writes (older → 410 Expired), or from "now" with synthetic ADDED events; objects
//     that stop (start) matching a selector are seen as DELETED (ADDED).
// Garbage collection runs synchronously inside the write that triggers it.
//
// Errors are thrown as ApiError. Thread-safety: all methods are thread-safe (one mutex);
// a Watcher is consumed by one thread but may be stopped from any.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apiserver/api_error.h"
#include "tests/apiserver/resources.h"
#include "tests/apiserver/selectors.h"

namespace spawnpoint::kubetest {

enum class FieldValidation { kIgnore, kWarn, kStrict };

struct WriteOptions {
  bool dry_run = false;
  FieldValidation field_validation = FieldValidation::kWarn;  // the server default
  bool is_patch = false;                         // strict errors are reported as for a patch
  std::vector<std::string>* warnings = nullptr;  // receives Warning header texts
};

struct DeleteOptions {
  std::string propagation;  // "", "Orphan", "Background", "Foreground"
  std::optional<int64_t> grace_period_seconds;
  std::string precondition_uid;
  std::string precondition_resource_version;
  bool dry_run = false;
};

struct ListOptions {
  LabelSelector labels;
  FieldSelector fields;
  int64_t limit = 0;
  std::string continue_token;
};

struct ListResult {
  std::vector<json> items;
  std::string resource_version;
  std::string continue_token;
  std::optional<int64_t> remaining_item_count;
};

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED
  json object;
  uint64_t resource_version = 0;
};

class Store;

// One watch: events queued by the store as they are committed.
class Watcher {
 public:
  enum class Result { kEvent, kTimeout, kStopped };
  // Waits for the next event until `deadline` or Stop().
  Result Next(WatchEvent* event, std::chrono::steady_clock::time_point deadline);
  // The resourceVersion up to which this watcher has been given every event it matches,
  // when its queue is empty (what a BOOKMARK may carry); 0 while events are pending.
  uint64_t IdleProgress();
  void Stop();
  bool stopped();

 private:
  friend class Store;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WatchEvent> queue_;
  uint64_t progress_rv_ = 0;
  bool stopped_ = false;
  // Filter (immutable after creation).
  std::string storage_key_;
  std::string api_version_;
  std::string namespace_;
  LabelSelector labels_;
  FieldSelector fields_;
};

class Store {
 public:
  struct Options {
    size_t watch_window = 10000;  // events retained for watch resumption
  };
  Store(Registry* registry, Options options);

  json Get(const ResourceInfo& info, const std::string& ns, const std::string& name);
  ListResult List(const ResourceInfo& info, const std::string& ns, const ListOptions& opts);
  json Create(const ResourceInfo& info, const std::string& ns, json object,
              const WriteOptions& opts);
  // PUT: `object` replaces the stored one (subresource "" or "status").
  json Update(const ResourceInfo& info, const std::string& ns, const std::string& name,
              const std::string& subresource, json object, const WriteOptions& opts);
  // PATCH: `apply` computes the new object from the current one (it may throw ApiError).
  json Patch(const ResourceInfo& info, const std::string& ns, const std::string& name,
             const std::string& subresource, const std::function<json(const json&)>& apply,
             const WriteOptions& opts);
  // Returns the object as deleted, or with deletionTimestamp set when finalizers (or a
  // running pod) hold it.
  json Delete(const ResourceInfo& info, const std::string& ns, const std::string& name,
              const DeleteOptions& opts);
  std::vector<json> DeleteCollection(const ResourceInfo& info, const std::string& ns,
                                     const ListOptions& list, const DeleteOptions& opts);

  // Starts a watch. `resource_version` "" or "0": synthetic ADDED events for the current
  // objects first. Throws GoneError when the version is older than the retained window.
  std::shared_ptr<Watcher> Watch(const ResourceInfo& info, const std::string& ns,
                                 const ListOptions& selectors, const std::string& resource_version);

  // For in-process actors (the node simulator): applies `mutate` to the current object
  // without admission or preconditions; no write when it returns false or changes
  // nothing. Returns the stored object afterwards, or null when it does not exist.
  json Mutate(const std::string& group, const std::string& plural, const std::string& ns,
              const std::string& name, const std::function<bool(json&)>& mutate);
  // Completes the graceful deletion of a pod whose processes have exited.
  void FinishPodTermination(const std::string& ns, const std::string& name, const std::string& uid);
  // Decides whether deleting this pod must wait for its processes (set by the runner).
  void SetPodGracefulDeletion(std::function<bool(const json& pod)> predicate);

  // Drops every retained event: older resourceVersions and continue tokens become 410.
  void Compact();
  uint64_t CurrentResourceVersion();
  // Wakes and stops every watcher (server shutdown).
  void StopAllWatchers();
  Registry* registry() { return registry_; }

 private:
  struct Event {
    uint64_t rv;
    std::string storage_key;
    std::string ns;
    std::string type;
    json object;
    json old_object;  // MODIFIED: the previous state, for selector transitions
  };
  using Bucket = std::map<std::string, json>;  // "<ns>/<name>" → object

  static std::string Key(const std::string& ns, const std::string& name) { return ns + "/" + name; }
  std::string NewUid();
  std::string Now() const;

  json CreateLocked(const ResourceInfo& info, const std::string& ns, json object,
                    const WriteOptions& opts);
  json UpdateLocked(const ResourceInfo& info, const std::string& ns, const std::string& name,
                    const std::string& subresource, json object, const WriteOptions& opts,
                    bool check_precondition);
  json DeleteLocked(const std::string& storage_key, const std::string& ns, const std::string& name,
                    const DeleteOptions& opts);
  // Writes `object` (already final) and emits the event. Returns the stored object.
  json CommitPut(const std::string& storage_key, const std::string& ns, const std::string& name,
                 json object, const json* old);
  void Remove(const std::string& storage_key, const std::string& ns, const std::string& name);
  void IndexOwners(const std::string& storage_key, const std::string& key, const json& object,
                   bool add);
  void CollectDependents(const std::string& owner_uid,
                         std::vector<std::tuple<std::string, std::string, std::string>>* out);
  void CheckForegroundOwners(const json& removed);
  void CheckNamespaceFinalization(const std::string& ns);
  bool ReadyToRemove(const std::string& storage_key, const json& object) const;
  void Admit(const ResourceInfo& info, json& object, const WriteOptions& opts,
             const std::string& name);
  void Emit(Event event);
  json ForVersion(const ResourceInfo& info, json object) const;
  void RunCrdSideEffects(const json& crd);

  Registry* registry_;
  Options options_;
  std::mutex mu_;
  std::map<std::string, Bucket> objects_;
  std::unordered_map<std::string, std::pair<std::string, std::string>> by_uid_;
  // Owner uid → dependents as (storage key, "<ns>/<name>"), so garbage collection does not
  // scan every object.
  std::unordered_map<std::string, std::set<std::pair<std::string, std::string>>> dependents_;
  std::deque<Event> log_;
  uint64_t rv_ = 0;
  uint64_t evicted_up_to_ = 0;
  std::vector<std::weak_ptr<Watcher>> watchers_;
  std::function<bool(const json&)> pod_graceful_;
  std::mt19937_64 rng_;
};

}  // namespace spawnpoint::kubetest
