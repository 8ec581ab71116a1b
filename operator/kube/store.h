// The informer cache: objects keyed "namespace/name" (or "name" when cluster-scoped),
// with secondary indexes. Objects are immutable once stored (shared_ptr<const Json>), so
// readers keep what they got while the store moves on. Built-in indexes: by namespace, by
// owner UID (metadata.ownerReferences[].uid) and by label ("key=value"). Thread-safe: the
// informer writes (one reflector per namespace, each writing its namespace's objects only),
// any number of readers.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "operator/kube/client.h"

namespace spawnpoint::kube {

using ObjectPtr = std::shared_ptr<const Json>;

// The values an object is indexed under (none is fine).
using IndexFunc = std::function<std::vector<std::string>(const Json& object)>;

inline constexpr const char* kNamespaceIndex = "namespace";
inline constexpr const char* kOwnerUidIndex = "owner-uid";
inline constexpr const char* kLabelIndex = "label";

std::vector<std::string> NamespaceIndexFunc(const Json& object);
std::vector<std::string> OwnerUidIndexFunc(const Json& object);
std::vector<std::string> LabelIndexFunc(const Json& object);  // "key=value" per label

class Store {
 public:
  // What Replace changed, for the informer's notifications.
  struct ReplaceResult {
    std::vector<ObjectPtr> added;
    std::vector<std::pair<ObjectPtr, ObjectPtr>> updated;  // old, new (resourceVersion moved)
    std::vector<ObjectPtr> unchanged;
    std::vector<ObjectPtr> deleted;  // last known state of objects no longer listed
  };

  // With the namespace, owner-UID and label indexes.
  Store();

  // Adds (or replaces) an index and indexes what is already stored.
  void AddIndex(const std::string& name, IndexFunc func);

  // Inserts or replaces the object under ObjectKey(*object); returns the previous one.
  ObjectPtr Upsert(ObjectPtr object);
  // Removes the key; returns what was stored (nullptr if nothing).
  ObjectPtr Remove(const std::string& key);
  // Makes the store hold exactly `objects`, atomically for readers. With `only_namespace`,
  // only that namespace's objects are replaced (those not listed deleted); the others stay.
  ReplaceResult Replace(std::vector<ObjectPtr> objects, const std::string& only_namespace = "");

  ObjectPtr Get(const std::string& key) const;
  ObjectPtr Get(const std::string& ns, const std::string& name) const;
  std::vector<ObjectPtr> List() const;
  std::vector<std::string> ListKeys() const;
  // Objects whose index function returned `value`; empty for an unknown index.
  std::vector<ObjectPtr> ByIndex(const std::string& index, const std::string& value) const;
  std::vector<std::string> IndexKeys(const std::string& index, const std::string& value) const;
  size_t Size() const;

 private:
  struct Index {
    IndexFunc func;
    std::unordered_map<std::string, std::set<std::string>> keys_by_value;
  };
  void IndexLocked(const std::string& key, const Json& object);
  void UnindexLocked(const std::string& key, const Json& object);

  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, ObjectPtr> objects_;
  std::map<std::string, Index> indexes_;
};

}  // namespace spawnpoint::kube
