#include "operator/kube/informer.h"

#include <algorithm>

namespace spawnpoint::kube {

void StripManagedFields(Json& object) {
  auto m = object.find("metadata");
  if (m != object.end() && m->is_object()) m->erase("managedFields");
}

Informer::Source::Source(Informer* informer, std::string ns)
    : informer(informer),
      ns(std::move(ns)),
      reflector(informer->client_, informer->gvr_, this->ns,
                ListOptions{.label_selector = informer->options_.label_selector,
                            .field_selector = informer->options_.field_selector},
                this, informer->options_.reflector) {}

Informer::Informer(Client* client, GroupVersionResource gvr, InformerOptions options)
    : client_(client), gvr_(std::move(gvr)), options_(std::move(options)) {
  std::vector<std::string> namespaces;
  for (const auto& ns : options_.namespaces) {
    if (std::find(namespaces.begin(), namespaces.end(), ns) == namespaces.end()) {
      namespaces.push_back(ns);
    }
  }
  if (namespaces.empty()) namespaces.push_back("");
  for (auto& ns : namespaces) sources_.push_back(std::make_unique<Source>(this, std::move(ns)));
}

Informer::~Informer() { Stop(); }

void Informer::AddEventHandler(EventHandler handler) { handlers_.push_back(std::move(handler)); }

void Informer::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopping_) return;
  started_ = true;
  dispatch_thread_ = std::thread([this] { DispatchLoop(); });
  for (auto& source : sources_) {
    Reflector* reflector = &source->reflector;
    source->thread = std::thread([reflector] { reflector->Run(); });
  }
}

void Informer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (auto& source : sources_) source->reflector.Stop();
  for (auto& source : sources_) {
    if (source->thread.joinable()) source->thread.join();
  }
  if (dispatch_thread_.joinable()) dispatch_thread_.join();
}

std::string Informer::LastResourceVersion(const std::string& ns) const {
  for (const auto& source : sources_) {
    if (ns.empty() || source->ns == ns) return source->reflector.LastResourceVersion();
  }
  return "";
}

ReflectorStats Informer::ReflectorStatistics() const {
  ReflectorStats sum;
  for (const auto& source : sources_) {
    ReflectorStats s = source->reflector.Stats();
    sum.lists += s.lists;
    sum.relists_on_gone += s.relists_on_gone;
    sum.watches += s.watches;
    sum.events += s.events;
    sum.bookmarks += s.bookmarks;
    sum.errors += s.errors;
  }
  return sum;
}

bool Informer::HasSynced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_;
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return synced_; });
}

ObjectPtr Informer::Freeze(Json object) const {
  if (options_.transform) options_.transform(object);
  return std::make_shared<const Json>(std::move(object));
}

void Informer::Push(std::vector<Notification> batch) {
  std::lock_guard<std::mutex> lock(mu_);
  PushLocked(std::move(batch));
}

void Informer::PushLocked(std::vector<Notification> batch) {
  if (stopping_) return;
  for (auto& n : batch) pending_.push_back(std::move(n));
  cv_.notify_all();
}

void Informer::Replace(Source* source, std::vector<Json> items) {
  std::vector<ObjectPtr> objects;
  objects.reserve(items.size());
  for (auto& item : items) objects.push_back(Freeze(std::move(item)));
  items.clear();
  // A namespace's reflector replaces that namespace's objects only.
  Store::ReplaceResult diff = store_.Replace(std::move(objects), source->ns);
  std::vector<Notification> batch;
  batch.reserve(diff.added.size() + diff.updated.size() + diff.deleted.size() + 1);
  // Deletions first: a name that was deleted and re-created in the gap shows up as an
  // update (same key), which is what a level-triggered handler wants anyway.
  for (auto& obj : diff.deleted) {
    batch.push_back({Notification::kDelete, nullptr, std::move(obj), true});
  }
  for (auto& [old_obj, new_obj] : diff.updated) {
    batch.push_back({Notification::kUpdate, std::move(old_obj), std::move(new_obj), false});
  }
  for (auto& obj : diff.added) batch.push_back({Notification::kAdd, nullptr, std::move(obj)});
  // Synced once every source has listed: the last one's first batch carries the mark, so
  // every source's first objects are delivered before it. Pushed under the lock that counts,
  // so no other source's batch can come between.
  std::lock_guard<std::mutex> lock(mu_);
  if (!source->listed) {
    source->listed = true;
    if (++sources_listed_ == sources_.size()) {
      batch.push_back({Notification::kSynced, nullptr, nullptr});
    }
  }
  PushLocked(std::move(batch));
}

void Informer::Apply(WatchEventType type, Json object) {
  ObjectPtr obj = Freeze(std::move(object));
  if (type == WatchEventType::kDeleted) {
    store_.Remove(ObjectKey(*obj));
    Push({{Notification::kDelete, nullptr, std::move(obj), false}});
    return;
  }
  ObjectPtr old = store_.Upsert(obj);
  if (old) {
    Push({{Notification::kUpdate, std::move(old), std::move(obj), false}});
  } else {
    Push({{Notification::kAdd, nullptr, std::move(obj), false}});
  }
}

void Informer::Deliver(const Notification& n) {
  for (const auto& h : handlers_) {
    switch (n.kind) {
      case Notification::kAdd:
        if (h.on_add) h.on_add(n.object);
        break;
      case Notification::kUpdate:
        if (h.on_update) h.on_update(n.old_object, n.object);
        break;
      case Notification::kDelete:
        if (h.on_delete) h.on_delete(n.object, n.final_state_unknown);
        break;
      case Notification::kSynced:
        break;
    }
  }
}

void Informer::DispatchLoop() {
  Clock* clock = client_->clock();
  const bool resync = options_.resync_period > Clock::Duration::zero();
  auto next_resync = resync ? clock->Now() + options_.resync_period : Clock::TimePoint::max();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    WaitUntil(clock, cv_, lock, next_resync, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    if (pending_.empty()) {
      // Resync is due.
      if (synced_) {
        lock.unlock();
        for (const auto& obj : store_.List()) {
          Deliver({Notification::kUpdate, obj, obj, false});
        }
        lock.lock();
      }
      next_resync = clock->Now() + options_.resync_period;
      continue;
    }
    Notification n = std::move(pending_.front());
    pending_.pop_front();
    if (n.kind == Notification::kSynced) {
      synced_ = true;
      cv_.notify_all();
      continue;
    }
    lock.unlock();
    Deliver(n);
    lock.lock();
  }
}

}  // namespace spawnpoint::kube
