// An informer: a reflector feeding a Store, plus event handlers called in order from one
// dispatch thread (never concurrently with each other, never under the store's lock).
// After a relist (410 Gone) the store is reconciled with the new list: objects no longer
// listed produce OnDelete with final_state_unknown = true (client-go's
// DeletedFinalStateUnknown), changed ones OnUpdate, new ones OnAdd.
// HasSynced() turns true once the first list is in the store and its OnAdd calls have
// returned. Thread-safe.
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
  std::string ns;  // "" watches all namespaces
  std::string label_selector;
  std::string field_selector;
  // Non-zero: every period, OnUpdate(obj, obj) for every cached object, so handlers that
  // missed something (a failed enqueue) get another chance.
  Clock::Duration resync_period{0};
  // Applied to each object before it is stored (to shed memory); nullptr stores as is.
  std::function<void(Json&)> transform = StripManagedFields;
  ReflectorOptions reflector;
};

class Informer : private ReflectorSink {
 public:
  Informer(Client* client, GroupVersionResource gvr, InformerOptions options = {});
  ~Informer();  // Stop()

  // Handlers and indexes must be added before Start().
  void AddEventHandler(EventHandler handler);
  void AddIndex(const std::string& name, IndexFunc func) { store_.AddIndex(name, std::move(func)); }
  // Starts the reflector and the dispatch threads.
  void Start();
  // Stops both threads; pending notifications are dropped. Idempotent.
  void Stop();

  bool HasSynced() const;
  // Waits (real time) until synced or the timeout passes.
  bool WaitForSync(std::chrono::milliseconds timeout) const;

  // The cache. Read-only for users: only the informer writes it.
  const Store& store() const { return store_; }
  std::string LastResourceVersion() const { return reflector_.LastResourceVersion(); }
  ReflectorStats ReflectorStatistics() const { return reflector_.Stats(); }
  const GroupVersionResource& gvr() const { return gvr_; }

 private:
  struct Notification {
    enum Kind { kAdd, kUpdate, kDelete, kSynced } kind;
    ObjectPtr old_object;
    ObjectPtr object;
    bool final_state_unknown = false;
  };

  // ReflectorSink, on the reflector's thread.
  void Replace(std::vector<Json> items, const std::string& resource_version) override;
  void Apply(WatchEventType type, Json object) override;

  ObjectPtr Freeze(Json object) const;
  void Push(std::vector<Notification> batch);
  void DispatchLoop();
  void Deliver(const Notification& n);

  Client* const client_;
  const GroupVersionResource gvr_;
  const InformerOptions options_;
  Store store_;
  Reflector reflector_;
  std::vector<EventHandler> handlers_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Notification> pending_;
  bool stopping_ = false;
  bool synced_ = false;
  bool first_replace_done_ = false;
  std::thread reflector_thread_;
  std::thread dispatch_thread_;
};

}  // namespace spawnpoint::kube
