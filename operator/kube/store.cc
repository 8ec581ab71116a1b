#include "operator/kube/store.h"

#include <unordered_set>

namespace spawnpoint::kube {

std::vector<std::string> NamespaceIndexFunc(const Json& object) { return {NamespaceOf(object)}; }

std::vector<std::string> OwnerUidIndexFunc(const Json& object) {
  std::vector<std::string> out;
  auto m = object.find("metadata");
  if (m == object.end() || !m->is_object()) return out;
  auto refs = m->find("ownerReferences");
  if (refs == m->end() || !refs->is_array()) return out;
  for (const auto& ref : *refs) {
    if (!ref.is_object()) continue;
    auto uid = ref.find("uid");
    if (uid != ref.end() && uid->is_string()) out.push_back(uid->get<std::string>());
  }
  return out;
}

std::vector<std::string> LabelIndexFunc(const Json& object) {
  std::vector<std::string> out;
  auto m = object.find("metadata");
  if (m == object.end() || !m->is_object()) return out;
  auto labels = m->find("labels");
  if (labels == m->end() || !labels->is_object()) return out;
  for (const auto& [k, v] : labels->items()) {
    if (v.is_string()) out.push_back(k + "=" + v.get<std::string>());
  }
  return out;
}

Store::Store() {
  indexes_[kNamespaceIndex].func = NamespaceIndexFunc;
  indexes_[kOwnerUidIndex].func = OwnerUidIndexFunc;
  indexes_[kLabelIndex].func = LabelIndexFunc;
}

void Store::IndexLocked(const std::string& key, const Json& object) {
  for (auto& [name, index] : indexes_) {
    for (auto& v : index.func(object)) index.keys_by_value[v].insert(key);
  }
}

void Store::UnindexLocked(const std::string& key, const Json& object) {
  for (auto& [name, index] : indexes_) {
    for (auto& v : index.func(object)) {
      auto it = index.keys_by_value.find(v);
      if (it == index.keys_by_value.end()) continue;
      it->second.erase(key);
      if (it->second.empty()) index.keys_by_value.erase(it);
    }
  }
}

void Store::AddIndex(const std::string& name, IndexFunc func) {
  std::unique_lock lock(mu_);
  Index& index = indexes_[name];
  index.func = std::move(func);
  index.keys_by_value.clear();
  for (const auto& [key, obj] : objects_) {
    for (auto& v : index.func(*obj)) index.keys_by_value[v].insert(key);
  }
}

ObjectPtr Store::Upsert(ObjectPtr object) {
  std::string key = ObjectKey(*object);
  std::unique_lock lock(mu_);
  ObjectPtr& slot = objects_[key];
  ObjectPtr old = std::move(slot);
  if (old) UnindexLocked(key, *old);
  slot = std::move(object);
  IndexLocked(key, *slot);
  return old;
}

ObjectPtr Store::Remove(const std::string& key) {
  std::unique_lock lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return nullptr;
  ObjectPtr old = std::move(it->second);
  objects_.erase(it);
  UnindexLocked(key, *old);
  return old;
}

Store::ReplaceResult Store::Replace(std::vector<ObjectPtr> objects,
                                    const std::string& only_namespace) {
  // Keys are "namespace/name": the namespace's own start with this.
  const std::string prefix = only_namespace.empty() ? "" : only_namespace + "/";
  ReplaceResult result;
  std::unique_lock lock(mu_);
  std::unordered_set<std::string> listed;
  listed.reserve(objects.size());
  for (auto& obj : objects) {
    std::string key = ObjectKey(*obj);
    listed.insert(key);
    ObjectPtr& slot = objects_[key];
    ObjectPtr old = std::move(slot);
    if (old) UnindexLocked(key, *old);
    slot = obj;
    IndexLocked(key, *slot);
    if (!old) {
      result.added.push_back(std::move(obj));
    } else if (ResourceVersionOf(*old) != ResourceVersionOf(*obj)) {
      result.updated.emplace_back(std::move(old), std::move(obj));
    } else {
      result.unchanged.push_back(std::move(obj));
    }
  }
  for (auto it = objects_.begin(); it != objects_.end();) {
    if (listed.count(it->first) || it->first.compare(0, prefix.size(), prefix) != 0) {
      ++it;
      continue;
    }
    UnindexLocked(it->first, *it->second);
    result.deleted.push_back(std::move(it->second));
    it = objects_.erase(it);
  }
  return result;
}

ObjectPtr Store::Get(const std::string& key) const {
  std::shared_lock lock(mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

ObjectPtr Store::Get(const std::string& ns, const std::string& name) const {
  return Get(ns.empty() ? name : ns + "/" + name);
}

std::vector<ObjectPtr> Store::List() const {
  std::shared_lock lock(mu_);
  std::vector<ObjectPtr> out;
  out.reserve(objects_.size());
  for (const auto& [k, v] : objects_) out.push_back(v);
  return out;
}

std::vector<std::string> Store::ListKeys() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  out.reserve(objects_.size());
  for (const auto& [k, v] : objects_) out.push_back(k);
  return out;
}

std::vector<std::string> Store::IndexKeys(const std::string& index,
                                          const std::string& value) const {
  std::shared_lock lock(mu_);
  auto idx = indexes_.find(index);
  if (idx == indexes_.end()) return {};
  auto it = idx->second.keys_by_value.find(value);
  if (it == idx->second.keys_by_value.end()) return {};
  return {it->second.begin(), it->second.end()};
}

std::vector<ObjectPtr> Store::ByIndex(const std::string& index, const std::string& value) const {
  std::shared_lock lock(mu_);
  std::vector<ObjectPtr> out;
  auto idx = indexes_.find(index);
  if (idx == indexes_.end()) return out;
  auto it = idx->second.keys_by_value.find(value);
  if (it == idx->second.keys_by_value.end()) return out;
  out.reserve(it->second.size());
  for (const auto& key : it->second) out.push_back(objects_.at(key));
  return out;
}

size_t Store::Size() const {
  std::shared_lock lock(mu_);
  return objects_.size();
}

}  // namespace spawnpoint::kube
