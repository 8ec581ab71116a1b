// An informer: reflectors feeding one Store, plus event handlers called in order from one
// dispatch thread (never concurrently with each other, never under the store's lock). One
// reflector watches every namespace, or one per listed namespace (the API has no watch of
// "these namespaces"; a namespaced RBAC Role allows no other), each on its own thread.
// After a relist (410 Gone) the store is reconciled with the new list, for the relisted
// namespace only: objects no longer listed produce OnDelete with final_state_unknown = true
// (client-go's DeletedFinalStateUnknown), changed ones OnUpdate, new ones OnAdd; the other
// namespaces' objects are untouched. HasSynced() turns true once every reflector's first list
// is in the store and its OnAdd calls have returned. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "operator/kube/client.h"
#include "operator/kube/reflector.h"
#include "operator/kube/store.h"

namespace spawnpoint::kube {

struct EventHandler {
  std::function<void(const ObjectPtr& object)> on_add;
  std::function<void(const ObjectPtr& old_object, const ObjectPtr& new_object)> on_update;
  // `last` is the deleted object's final state, or, when final_state_unknown, the last state
  // this cache saw before the deletion was missed in a watch gap.
  std::function<void(const ObjectPtr& last, bool final_state_unknown)> on_delete;
};

// Drops metadata.managedFields: large, and no controller here reads it.
void StripManagedFields(Json& object);

struct InformerOptions {
  // The namespaces to watch, one reflector each; empty: one reflector for every namespace (and
  // for cluster-scoped resources). Duplicates are watched once.
  std::vector<std::string> namespaces;
  std::string label_selector;
  std::string field_selector;
  // Non-zero: every period, OnUpdate(obj, obj) for every cached object, so handlers that
  // missed something (a failed enqueue) get another chance.
  Clock::Duration resync_period{0};
  // Applied to each object before it is stored (to shed memory); nullptr stores as is.
  std::function<void(Json&)> transform = StripManagedFields;
  ReflectorOptions reflector;
};

class Informer {
 public:
  Informer(Client* client, GroupVersionResource gvr, InformerOptions options = {});
  ~Informer();  // Stop()

  // Handlers and indexes must be added before Start().
  void AddEventHandler(EventHandler handler);
  void AddIndex(const std::string& name, IndexFunc func) { store_.AddIndex(name, std::move(func)); }
  // Starts the reflectors' and the dispatch threads.
  void Start();
  // Stops the threads; pending notifications are dropped. Idempotent.
  void Stop();

  bool HasSynced() const;
  // Waits (real time) until synced or the timeout passes.
  bool WaitForSync(std::chrono::milliseconds timeout) const;

  // The cache. Read-only for users: only the informer writes it.
  const Store& store() const { return store_; }
  // The last resourceVersion the reflector of `ns` saw ("": the first reflector's, the only
  // one without a list of namespaces); "" for a namespace not watched.
  std::string LastResourceVersion(const std::string& ns = "") const;
  // The reflectors' statistics, summed.
  ReflectorStats ReflectorStatistics() const;
  const GroupVersionResource& gvr() const { return gvr_; }

 private:
  // One reflector and its namespace ("": every namespace); the informer is its sink.
  struct Source : ReflectorSink {
    Source(Informer* informer, std::string ns);
    void Replace(std::vector<Json> items, const std::string& resource_version) override {
      informer->Replace(this, std::move(items));
    }
    void Apply(WatchEventType type, Json object) override {
      informer->Apply(type, std::move(object));
    }
    Informer* const informer;
    const std::string ns;
    Reflector reflector;
    bool listed = false;  // guarded by the informer's mu_
    std::thread thread;
  };

  struct Notification {
    enum Kind { kAdd, kUpdate, kDelete, kSynced } kind;
    ObjectPtr old_object;
    ObjectPtr object;
    bool final_state_unknown = false;
  };

  // From a source's reflector, on its thread.
  void Replace(Source* source, std::vector<Json> items);
  void Apply(WatchEventType type, Json object);

  ObjectPtr Freeze(Json object) const;
  void Push(std::vector<Notification> batch);
  void PushLocked(std::vector<Notification> batch);  // REQUIRES: mu_ held
  void DispatchLoop();
  void Deliver(const Notification& n);

  Client* const client_;
  const GroupVersionResource gvr_;
  const InformerOptions options_;
  Store store_;
  std::vector<std::unique_ptr<Source>> sources_;  // constant after construction
  std::vector<EventHandler> handlers_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Notification> pending_;
  bool stopping_ = false;
  bool synced_ = false;
  bool started_ = false;
  size_t sources_listed_ = 0;  // sources whose first list is in the store
  std::thread dispatch_thread_;
};

}  // namespace spawnpoint::kube
