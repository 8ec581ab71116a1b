#include "tests/apiserver/store.h"

#include <algorithm>
#include <regex>
#include <set>

#include "tests/apiserver/schema.h"
#include "tests/apiserver/table.h"
#include "tests/apiserver/util.h"

namespace spawnpoint::kubetest {
namespace {

const char* kCrdKey = "apiextensions.k8s.io/customresourcedefinitions";
const char* kNamespaceKey = "/namespaces";
const char* kPodKey = "/pods";
const char* kForegroundFinalizer = "foregroundDeletion";

json& Meta(json& o) {
  if (!o.contains("metadata") || !o["metadata"].is_object()) o["metadata"] = json::object();
  return o["metadata"];
}

const json& MetaOf(const json& o) {
  static const json kEmpty = json::object();
  auto it = o.find("metadata");
  return it != o.end() && it->is_object() ? *it : kEmpty;
}

std::vector<std::string> Finalizers(const json& o) { return Strings(MetaOf(o), "finalizers"); }

bool Deleting(const json& o) { return MetaOf(o).contains("deletionTimestamp"); }

std::pair<std::string, std::string> SplitStorageKey(const std::string& sk) {
  size_t slash = sk.find('/');
  return {sk.substr(0, slash), sk.substr(slash + 1)};
}

// The object without the parts whose changes do not bump generation.
json SpecPart(const json& o, bool ignore_status) {
  json c = o;
  c.erase("metadata");
  if (ignore_status) c.erase("status");
  return c;
}

bool IsDns1123Subdomain(const std::string& s) {
  static const std::regex re("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return s.size() <= 253 && std::regex_match(s, re);
}

bool IsDns1123Label(const std::string& s) {
  static const std::regex re("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return s.size() <= 63 && std::regex_match(s, re);
}

void ValidateName(const ResourceInfo& info, const std::string& name) {
  if (info.group == "rbac.authorization.k8s.io") {
    if (name.find('/') != std::string::npos || name.find('%') != std::string::npos) {
      throw InvalidError(
          info.group, info.kind, name,
          {{FieldError::Type::kInvalid, "metadata.name", name, "may not contain '/' or '%'"}});
    }
    return;
  }
  bool label = info.group.empty() && (info.plural == "namespaces" || info.plural == "services");
  if (label && !IsDns1123Label(name)) {
    throw InvalidError(
        info.group, info.kind, name,
        {{FieldError::Type::kInvalid, "metadata.name", name,
          "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
          "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
          "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"}});
  }
  if (!label && !IsDns1123Subdomain(name)) {
    throw InvalidError(
        info.group, info.kind, name,
        {{FieldError::Type::kInvalid, "metadata.name", name,
          "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
          "'-' or '.', and must start and end with an alphanumeric character (e.g. "
          "'example.com', regex used for validation is "
          "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"}});
  }
}

void DefaultPod(json& pod) {
  json& spec = pod["spec"];
  if (!spec.is_object()) spec = json::object();
  if (!spec.contains("restartPolicy")) spec["restartPolicy"] = "Always";
  if (!spec.contains("terminationGracePeriodSeconds")) spec["terminationGracePeriodSeconds"] = 30;
  if (!spec.contains("dnsPolicy")) spec["dnsPolicy"] = "ClusterFirst";
  if (!spec.contains("schedulerName")) spec["schedulerName"] = "default-scheduler";
  if (!spec.contains("enableServiceLinks")) spec["enableServiceLinks"] = true;
  for (const char* list : {"containers", "initContainers"}) {
    if (!spec.contains(list) || !spec[list].is_array()) continue;
    for (auto& c : spec[list]) {
      if (!c.is_object()) continue;
      if (!c.contains("terminationMessagePath")) {
        c["terminationMessagePath"] = "/dev/termination-log";
      }
      if (!c.contains("terminationMessagePolicy")) c["terminationMessagePolicy"] = "File";
      if (!c.contains("imagePullPolicy")) {
        std::string image = c.value("image", "");
        bool latest = image.find(':') == std::string::npos ||
                      (image.size() >= 7 && image.compare(image.size() - 7, 7, ":latest") == 0);
        c["imagePullPolicy"] = latest ? "Always" : "IfNotPresent";
      }
    }
  }
  pod["status"] = {{"phase", "Pending"}, {"qosClass", "BestEffort"}};
}

}  // namespace

// ---- Watcher ----

Watcher::Result Watcher::Next(WatchEvent* event, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return stopped_ || !queue_.empty(); });
  if (stopped_) return Result::kStopped;
  if (queue_.empty()) return Result::kTimeout;
  *event = std::move(queue_.front());
  queue_.pop_front();
  return Result::kEvent;
}

uint64_t Watcher::IdleProgress() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() ? progress_rv_ : 0;
}

void Watcher::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

bool Watcher::stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

// ---- Store ----

Store::Store(Registry* registry, Options options)
    : registry_(registry), options_(options), rng_(std::random_device{}()) {
  auto ns_info = registry_->Find("", "v1", "namespaces");
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    CreateLocked(*ns_info, "", json{{"metadata", {{"name", ns}}}}, WriteOptions{});
  }
}

std::string Store::NewUid() {
  uint64_t a = rng_(), b = rng_();
  char buf[40];
  snprintf(buf, sizeof(buf), "%08x-%04x-4%03x-%04x-%012llx", static_cast<unsigned>(a >> 32),
           static_cast<unsigned>((a >> 16) & 0xFFFF), static_cast<unsigned>(a & 0xFFF),
           static_cast<unsigned>(0x8000 | ((b >> 48) & 0x3FFF)),
           static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFULL));
  return buf;
}

std::string Store::Now() const { return FormatTimestamp(std::chrono::system_clock::now()); }

json Store::ForVersion(const ResourceInfo& info, json object) const {
  if (object.is_object()) object["apiVersion"] = info.api_version();
  return object;
}

uint64_t Store::CurrentResourceVersion() {
  std::lock_guard<std::mutex> lock(mu_);
  return rv_;
}

void Store::SetPodGracefulDeletion(std::function<bool(const json&)> predicate) {
  std::lock_guard<std::mutex> lock(mu_);
  pod_graceful_ = std::move(predicate);
}

json Store::Get(const ResourceInfo& info, const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& bucket = objects_[info.storage_key()];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end()) throw NotFoundError(info.group, info.plural, name);
  return ForVersion(info, it->second);
}

ListResult Store::List(const ResourceInfo& info, const std::string& ns, const ListOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  ListResult result;
  uint64_t list_rv = rv_;
  std::string start_after;
  if (!opts.continue_token.empty()) {
    std::string decoded;
    json token;
    if (Base64Decode(opts.continue_token, &decoded)) token = json::parse(decoded, nullptr, false);
    if (!token.is_object() || !token.contains("rv") || !token.contains("start")) {
      throw BadRequestError("continue key is not valid: incorrect encoded start resourceVersion");
    }
    list_rv = token["rv"].get<uint64_t>();
    start_after = token["start"].get<std::string>();
    if (list_rv < evicted_up_to_) {
      throw GoneError(
          "The provided continue parameter is too old to display a consistent list result. You "
          "can start a new list without the continue parameter, or use the continue token in "
          "this response to retrieve the remainder of the results. Continuing with the "
          "provided token results in an inconsistent list - objects that were created, "
          "modified, or deleted between the time the first chunk was returned and now may "
          "show up in the list.");
    }
  }
  result.resource_version = std::to_string(list_rv);
  auto& bucket = objects_[info.storage_key()];
  auto it = ns.empty() ? bucket.begin() : bucket.lower_bound(ns + "/");
  if (!start_after.empty()) it = bucket.upper_bound(start_after);
  // '0' follows '/' in ASCII: the end of one namespace's key range.
  auto end = ns.empty() ? bucket.end() : bucket.lower_bound(ns + "0");
  int64_t remaining = 0;
  std::string last_key;
  for (; it != end; ++it) {
    if (!ns.empty() && it->first.compare(0, ns.size() + 1, ns + "/") != 0) break;
    const json& obj = it->second;
    if (!opts.labels.Matches(MetaOf(obj).value("labels", json()))) continue;
    if (!opts.fields.Matches(obj)) continue;
    if (opts.limit > 0 && static_cast<int64_t>(result.items.size()) >= opts.limit) {
      ++remaining;
      continue;
    }
    result.items.push_back(ForVersion(info, obj));
    last_key = it->first;
  }
  if (remaining > 0) {
    result.continue_token = Base64Encode(json{{"rv", list_rv}, {"start", last_key}}.dump());
    result.remaining_item_count = remaining;
  }
  return result;
}

void Store::Admit(const ResourceInfo& info, json& object, const WriteOptions& opts,
                  const std::string& name) {
  if (!info.custom || !info.schema.is_object()) return;
  std::vector<std::string> unknown;
  PruneUnknownFields(object, info.schema, &unknown);
  if (!unknown.empty() && opts.field_validation != FieldValidation::kIgnore) {
    std::string list;
    for (const auto& u : unknown)
      list += (list.empty() ? "" : ", ") + std::string("unknown field \"") + u + "\"";
    if (opts.field_validation == FieldValidation::kStrict) {
      if (opts.is_patch) {
        FieldError e{FieldError::Type::kInvalid, "patch", json(""),
                     "strict decoding error: " + list};
        e.omit_value = true;
        throw ApiError(
            422, "Invalid", e.ToString(),
            json{{"causes",
                  json::array(
                      {{{"reason", e.Reason()}, {"message", e.Body()}, {"field", e.field}}})}});
      }
      throw BadRequestError(info.kind + " in version \"" + info.version +
                            "\" cannot be handled as a " + info.kind +
                            ": strict decoding error: " + list);
    }
    if (opts.warnings) {
      for (const auto& u : unknown) opts.warnings->push_back("unknown field \"" + u + "\"");
    }
  }
  ApplyDefaults(object, info.schema);
  auto errors = ValidateAgainstSchema(object, info.schema);
  if (!errors.empty()) throw InvalidError(info.group, info.kind, name, errors);
}

json Store::Create(const ResourceInfo& info, const std::string& ns, json object,
                   const WriteOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  return ForVersion(info, CreateLocked(info, ns, std::move(object), opts));
}

json Store::CreateLocked(const ResourceInfo& info, const std::string& ns, json object,
                         const WriteOptions& opts) {
  if (!object.is_object()) throw BadRequestError("the body of the request must be a JSON object");
  std::string body_api_version = Str(object, "apiVersion");
  if (!body_api_version.empty() && body_api_version != info.api_version()) {
    throw BadRequestError("the API version in the data (" + body_api_version +
                          ") does not match the expected API version (" + info.api_version() + ")");
  }
  std::string body_kind = Str(object, "kind");
  if (!body_kind.empty() && body_kind != info.kind) {
    throw BadRequestError("the kind in the data (" + body_kind +
                          ") does not match the expected kind (" + info.kind + ")");
  }
  object["apiVersion"] = info.api_version();
  object["kind"] = info.kind;
  json& meta = Meta(object);
  if (info.namespaced) {
    std::string body_ns = Str(meta, "namespace");
    if (!body_ns.empty() && body_ns != ns) {
      throw BadRequestError(
          "the namespace of the provided object does not match the namespace sent on the "
          "request");
    }
    meta["namespace"] = ns;
  } else {
    meta.erase("namespace");
  }
  auto& bucket = objects_[info.storage_key()];
  std::string name = Str(meta, "name");
  if (name.empty() && !Str(meta, "generateName").empty()) {
    static const char* kAlphabet = "bcdfghjklmnpqrstvwxz2456789";
    do {
      name = Str(meta, "generateName");
      for (int i = 0; i < 5; ++i) name.push_back(kAlphabet[rng_() % 27]);
    } while (bucket.count(Key(ns, name)));
    meta["name"] = name;
  }
  if (name.empty()) {
    throw InvalidError(info.group, info.kind, "",
                       {{FieldError::Type::kRequired, "metadata.name", nullptr,
                         "name or generateName is required"}});
  }
  ValidateName(info, name);
  if (info.namespaced) {
    auto& namespaces = objects_[kNamespaceKey];
    auto nit = namespaces.find(Key("", ns));
    if (nit == namespaces.end()) throw NotFoundError("", "namespaces", ns);
    if (Deleting(nit->second)) {
      throw ForbiddenError(
          info.group, info.plural, name,
          "unable to create new content in namespace " + ns + " because it is being terminated");
    }
  }
  if (bucket.count(Key(ns, name))) throw AlreadyExistsError(info.group, info.plural, name);
  for (const char* f : {"uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                        "selfLink", "generation"}) {
    meta.erase(f);
  }
  meta["uid"] = NewUid();
  meta["creationTimestamp"] = Now();
  if (info.has_generation) meta["generation"] = 1;

  const std::string sk = info.storage_key();
  if (info.custom && info.status_subresource) object.erase("status");
  if (sk == kPodKey) {
    json containers = object.value("spec", json::object()).value("containers", json::array());
    if (!containers.is_array() || containers.empty()) {
      throw InvalidError("", "Pod", name,
                         {{FieldError::Type::kRequired, "spec.containers", nullptr, ""}});
    }
    DefaultPod(object);
  } else if (sk == kNamespaceKey) {
    object["spec"] = {{"finalizers", {"kubernetes"}}};
    object["status"] = {{"phase", "Active"}};
    meta["labels"]["kubernetes.io/metadata.name"] = name;
  } else if (sk == "/services") {
    json& spec = object["spec"];
    if (!spec.is_object()) spec = json::object();
    if (!spec.contains("type")) spec["type"] = "ClusterIP";
    if (!spec.contains("sessionAffinity")) spec["sessionAffinity"] = "None";
    if (!spec.contains("clusterIP") || spec["clusterIP"] == "") {
      spec["clusterIP"] =
          "10.96." + std::to_string((rv_ / 250) % 250) + "." + std::to_string(rv_ % 250 + 2);
    }
    spec["clusterIPs"] = json::array({spec["clusterIP"]});
    if (spec.contains("ports") && spec["ports"].is_array()) {
      for (auto& p : spec["ports"]) {
        if (!p.contains("protocol")) p["protocol"] = "TCP";
        if (!p.contains("targetPort") && p.contains("port")) p["targetPort"] = p["port"];
      }
    }
    object["status"] = {{"loadBalancer", json::object()}};
  } else if (sk == kCrdKey) {
    auto errs = CheckCrd(object);
    if (!errs.empty()) throw InvalidError(info.group, info.kind, name, errs);
  }
  Admit(info, object, opts, name);
  if (opts.dry_run) return object;
  if (sk == kCrdKey) {
    std::string storage;
    for (const auto& v : object["spec"]["versions"]) {
      if (v.value("storage", false)) storage = v.value("name", "");
    }
    std::string now = Now();
    object["status"] = {{"acceptedNames", object["spec"]["names"]},
                        {"storedVersions", {storage}},
                        {"conditions",
                         {{{"type", "NamesAccepted"},
                           {"status", "True"},
                           {"reason", "NoConflicts"},
                           {"message", "no conflicts found"},
                           {"lastTransitionTime", now}},
                          {{"type", "Established"},
                           {"status", "True"},
                           {"reason", "InitialNamesAccepted"},
                           {"message", "the initial names have been accepted"},
                           {"lastTransitionTime", now}}}}};
  }
  json stored = CommitPut(sk, ns, name, std::move(object), nullptr);
  if (sk == kCrdKey) registry_->RegisterCrd(stored);
  return stored;
}

json Store::Update(const ResourceInfo& info, const std::string& ns, const std::string& name,
                   const std::string& subresource, json object, const WriteOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  return ForVersion(info, UpdateLocked(info, ns, name, subresource, std::move(object), opts, true));
}

json Store::Patch(const ResourceInfo& info, const std::string& ns, const std::string& name,
                  const std::string& subresource, const std::function<json(const json&)>& apply,
                  const WriteOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& bucket = objects_[info.storage_key()];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end()) throw NotFoundError(info.group, info.plural, name);
  json current = ForVersion(info, it->second);
  json patched = apply(current);
  if (!patched.is_object()) throw BadRequestError("the patch did not produce an object");
  // A patch carries the current resourceVersion unless it sets one itself, which then acts
  // as a precondition (the way kubectl and controllers use it).
  return ForVersion(info,
                    UpdateLocked(info, ns, name, subresource, std::move(patched), opts, true));
}

json Store::UpdateLocked(const ResourceInfo& info, const std::string& ns, const std::string& name,
                         const std::string& subresource, json object, const WriteOptions& opts,
                         bool check_precondition) {
  const std::string sk = info.storage_key();
  auto& bucket = objects_[sk];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end()) throw NotFoundError(info.group, info.plural, name);
  const json current = it->second;
  if (!object.is_object()) throw BadRequestError("the body of the request must be a JSON object");
  std::string body_api_version = Str(object, "apiVersion");
  if (!body_api_version.empty() && body_api_version != info.api_version()) {
    throw BadRequestError("the API version in the data (" + body_api_version +
                          ") does not match the expected API version (" + info.api_version() + ")");
  }
  json& body_meta = Meta(object);
  std::string body_name = Str(body_meta, "name");
  if (!body_name.empty() && body_name != name) {
    throw BadRequestError("the name of the object (" + body_name +
                          ") does not match the name on the URL (" + name + ")");
  }
  std::string body_rv = Str(body_meta, "resourceVersion");
  const json& cur_meta = MetaOf(current);
  if (check_precondition && !body_rv.empty() && body_rv != Str(cur_meta, "resourceVersion")) {
    throw StaleConflictError(info.group, info.plural, name);
  }
  if (body_rv.empty() && !info.allow_unconditional_update) {
    FieldError e{FieldError::Type::kInvalid, "metadata.resourceVersion", json(0),
                 "must be specified for an update"};
    throw InvalidError(info.group, info.kind, name, {e});
  }

  json result;
  if (subresource == "status") {
    result = current;
    if (object.contains("status")) {
      result["status"] = object["status"];
    } else {
      result.erase("status");
    }
  } else {
    result = std::move(object);
    if (info.status_subresource) {
      if (current.contains("status")) {
        result["status"] = current["status"];
      } else {
        result.erase("status");
      }
    }
    json& meta = Meta(result);
    for (const char* f : {"uid", "creationTimestamp", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation", "namespace"}) {
      if (cur_meta.contains(f)) {
        meta[f] = cur_meta[f];
      } else {
        meta.erase(f);
      }
    }
    meta["name"] = name;
    meta.erase("selfLink");
    if (Deleting(current)) {
      auto old_f = Finalizers(current);
      for (const auto& f : Finalizers(result)) {
        if (std::find(old_f.begin(), old_f.end(), f) == old_f.end()) {
          throw InvalidError(info.group, info.kind, name,
                             {{FieldError::Type::kForbidden, "metadata.finalizers", nullptr,
                               "no new finalizers can be added if the object is being deleted, "
                               "found new finalizers []string{\"" +
                                   f + "\"}"}});
        }
      }
    }
  }
  result["apiVersion"] = info.api_version();
  result["kind"] = info.kind;
  Meta(result)["resourceVersion"] = cur_meta.value("resourceVersion", "");
  if (sk == kCrdKey && subresource.empty()) {
    auto errs = CheckCrd(result);
    if (!errs.empty()) throw InvalidError(info.group, info.kind, name, errs);
  }
  Admit(info, result, opts, name);
  if (info.has_generation && SpecPart(result, info.status_subresource) !=
                                 SpecPart(ForVersion(info, current), info.status_subresource)) {
    Meta(result)["generation"] = cur_meta.value("generation", 1) + 1;
  }
  if (result == ForVersion(info, current)) return current;  // no-op: nothing is written
  if (opts.dry_run) return result;
  json stored = CommitPut(sk, ns, name, std::move(result), &current);
  if (sk == kCrdKey) registry_->RegisterCrd(stored);
  if (ReadyToRemove(sk, stored)) Remove(sk, ns, name);
  return stored;
}

json Store::CommitPut(const std::string& storage_key, const std::string& ns,
                      const std::string& name, json object, const json* old) {
  ++rv_;
  Meta(object)["resourceVersion"] = std::to_string(rv_);
  const std::string key = Key(ns, name);
  const std::string uid = Str(MetaOf(object), "uid");
  by_uid_[uid] = {storage_key, key};
  if (old) IndexOwners(storage_key, key, *old, false);
  IndexOwners(storage_key, key, object, true);
  objects_[storage_key][key] = object;
  Emit(Event{rv_, storage_key, ns, old ? "MODIFIED" : "ADDED", object, old ? *old : json()});
  return object;
}

bool Store::ReadyToRemove(const std::string& storage_key, const json& object) const {
  if (!Deleting(object) || !Finalizers(object).empty()) return false;
  if (storage_key == kPodKey && MetaOf(object).value("deletionGracePeriodSeconds", 0) > 0) {
    return false;  // the (simulated) kubelet has not finished yet
  }
  if (storage_key == kNamespaceKey) {
    std::string ns = Str(MetaOf(object), "name");
    for (const auto& [sk, bucket] : objects_) {
      auto it = bucket.lower_bound(ns + "/");
      if (it != bucket.end() && it->first.compare(0, ns.size() + 1, ns + "/") == 0) return false;
    }
  }
  return true;
}

void Store::Remove(const std::string& storage_key, const std::string& ns, const std::string& name) {
  auto& bucket = objects_[storage_key];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end()) return;
  json obj = std::move(it->second);
  bucket.erase(it);
  const std::string uid = Str(MetaOf(obj), "uid");
  by_uid_.erase(uid);
  IndexOwners(storage_key, Key(ns, name), obj, false);
  ++rv_;
  Meta(obj)["resourceVersion"] = std::to_string(rv_);
  Emit(Event{rv_, storage_key, ns, "DELETED", obj, json()});

  if (storage_key == kCrdKey) {
    std::string crd_name = Str(MetaOf(obj), "name");
    const json& spec = obj["spec"];
    std::string cr_key = spec.value("group", "") + "/" + spec["names"].value("plural", "");
    registry_->UnregisterCrd(crd_name);
    // The real server deletes every custom resource before the CRD goes away.
    std::vector<std::pair<std::string, std::string>> keys;
    for (const auto& [k, o] : objects_[cr_key]) {
      keys.push_back({Str(MetaOf(o), "namespace"), Str(MetaOf(o), "name")});
    }
    for (const auto& [cns, cname] : keys) Remove(cr_key, cns, cname);
  }

  // Garbage collection of dependents whose only existing owner this was.
  std::vector<std::tuple<std::string, std::string, std::string>> dependents;
  CollectDependents(uid, &dependents);
  for (const auto& [dsk, dns, dname] : dependents) {
    auto dit = objects_[dsk].find(Key(dns, dname));
    if (dit == objects_[dsk].end()) continue;
    json dep = dit->second;
    bool other_owner = false;
    json kept = json::array();
    for (const auto& ref : MetaOf(dep).value("ownerReferences", json::array())) {
      if (ref.value("uid", "") == uid) continue;
      kept.push_back(ref);
      if (by_uid_.count(ref.value("uid", ""))) other_owner = true;
    }
    if (other_owner) {
      json before = dep;
      Meta(dep)["ownerReferences"] = kept;
      CommitPut(dsk, dns, dname, dep, &before);
    } else {
      DeleteOptions background;
      background.propagation = "Background";
      DeleteLocked(dsk, dns, dname, background);
    }
  }
  CheckForegroundOwners(obj);
  if (!ns.empty()) CheckNamespaceFinalization(ns);
}

void Store::IndexOwners(const std::string& storage_key, const std::string& key, const json& object,
                        bool add) {
  const json& meta = MetaOf(object);
  auto refs = meta.find("ownerReferences");
  if (refs == meta.end() || !refs->is_array()) return;
  for (const auto& ref : *refs) {
    std::string owner = ref.value("uid", "");
    if (owner.empty()) continue;
    if (add) {
      dependents_[owner].insert({storage_key, key});
    } else {
      auto it = dependents_.find(owner);
      if (it == dependents_.end()) continue;
      it->second.erase({storage_key, key});
      if (it->second.empty()) dependents_.erase(it);
    }
  }
}

void Store::CollectDependents(const std::string& owner_uid,
                              std::vector<std::tuple<std::string, std::string, std::string>>* out) {
  auto it = dependents_.find(owner_uid);
  if (it == dependents_.end()) return;
  for (const auto& [sk, key] : it->second) {
    size_t slash = key.find('/');
    out->emplace_back(sk, key.substr(0, slash), key.substr(slash + 1));
  }
}

void Store::CheckForegroundOwners(const json& removed) {
  for (const auto& ref : MetaOf(removed).value("ownerReferences", json::array())) {
    auto loc = by_uid_.find(ref.value("uid", ""));
    if (loc == by_uid_.end()) continue;
    auto [osk, okey] = loc->second;
    json owner = objects_[osk][okey];
    auto fin = Finalizers(owner);
    if (!Deleting(owner) || std::find(fin.begin(), fin.end(), kForegroundFinalizer) == fin.end()) {
      continue;
    }
    std::vector<std::tuple<std::string, std::string, std::string>> deps;
    CollectDependents(Str(MetaOf(owner), "uid"), &deps);
    bool blocked = false;
    for (const auto& [dsk, dns, dname] : deps) {
      const json& dep = objects_[dsk][Key(dns, dname)];
      for (const auto& r : MetaOf(dep).value("ownerReferences", json::array())) {
        if (r.value("uid", "") == Str(MetaOf(owner), "uid") &&
            r.value("blockOwnerDeletion", false)) {
          blocked = true;
        }
      }
    }
    if (blocked) continue;
    json before = owner;
    fin.erase(std::remove(fin.begin(), fin.end(), kForegroundFinalizer), fin.end());
    Meta(owner)["finalizers"] = fin;
    if (fin.empty()) Meta(owner).erase("finalizers");
    std::string ons = Str(MetaOf(owner), "namespace"), oname = Str(MetaOf(owner), "name");
    json stored = CommitPut(osk, ons, oname, owner, &before);
    if (ReadyToRemove(osk, stored)) Remove(osk, ons, oname);
  }
}

void Store::CheckNamespaceFinalization(const std::string& ns) {
  auto& namespaces = objects_[kNamespaceKey];
  auto it = namespaces.find(Key("", ns));
  if (it == namespaces.end() || !Deleting(it->second)) return;
  if (ReadyToRemove(kNamespaceKey, it->second)) Remove(kNamespaceKey, "", ns);
}

json Store::Delete(const ResourceInfo& info, const std::string& ns, const std::string& name,
                   const DeleteOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  return ForVersion(info, DeleteLocked(info.storage_key(), ns, name, opts));
}

json Store::DeleteLocked(const std::string& storage_key, const std::string& ns,
                         const std::string& name, const DeleteOptions& opts) {
  auto [group, plural] = SplitStorageKey(storage_key);
  auto& bucket = objects_[storage_key];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end()) throw NotFoundError(group, plural, name);
  json obj = it->second;
  const json& meta = MetaOf(obj);
  if (!opts.precondition_uid.empty() && opts.precondition_uid != Str(meta, "uid")) {
    throw ConflictError(group, plural, name,
                        "Precondition failed: UID in precondition: " + opts.precondition_uid +
                            ", UID in object meta: " + Str(meta, "uid"));
  }
  if (!opts.precondition_resource_version.empty() &&
      opts.precondition_resource_version != Str(meta, "resourceVersion")) {
    throw ConflictError(group, plural, name,
                        "Precondition failed: ResourceVersion in precondition: " +
                            opts.precondition_resource_version +
                            ", ResourceVersion in object meta: " + Str(meta, "resourceVersion"));
  }
  if (opts.dry_run) return obj;
  const std::string uid = Str(meta, "uid");
  std::string policy = opts.propagation.empty() ? "Background" : opts.propagation;

  if (policy == "Orphan") {
    std::vector<std::tuple<std::string, std::string, std::string>> deps;
    CollectDependents(uid, &deps);
    for (const auto& [dsk, dns, dname] : deps) {
      json dep = objects_[dsk][Key(dns, dname)];
      json before = dep;
      json kept = json::array();
      for (const auto& ref : MetaOf(dep).value("ownerReferences", json::array())) {
        if (ref.value("uid", "") != uid) kept.push_back(ref);
      }
      if (kept.empty()) {
        Meta(dep).erase("ownerReferences");
      } else {
        Meta(dep)["ownerReferences"] = kept;
      }
      CommitPut(dsk, dns, dname, dep, &before);
    }
  }

  if (Deleting(obj)) {
    // A second delete of a pod with a zero grace period forces it out, like kubectl
    // delete --grace-period=0 --force.
    if (storage_key == kPodKey && opts.grace_period_seconds.value_or(1) == 0) {
      json before = obj;
      Meta(obj)["deletionGracePeriodSeconds"] = 0;
      json stored = CommitPut(storage_key, ns, name, obj, &before);
      if (ReadyToRemove(storage_key, stored)) Remove(storage_key, ns, name);
      return stored;
    }
    return obj;
  }

  std::vector<std::tuple<std::string, std::string, std::string>> deps;
  if (policy == "Foreground") CollectDependents(uid, &deps);
  std::vector<std::string> finalizers = Finalizers(obj);
  if (!deps.empty()) finalizers.push_back(kForegroundFinalizer);

  bool graceful_pod = false;
  int64_t grace = 0;
  if (storage_key == kPodKey && pod_graceful_ && pod_graceful_(obj)) {
    grace = opts.grace_period_seconds.value_or(
        obj.value("spec", json::object()).value("terminationGracePeriodSeconds", 30));
    graceful_pod = grace > 0;
  }
  bool is_namespace = storage_key == kNamespaceKey;

  if (finalizers.empty() && !graceful_pod && !is_namespace) {
    Remove(storage_key, ns, name);
    return obj;
  }
  json before = obj;
  json& m = Meta(obj);
  m["deletionTimestamp"] =
      FormatTimestamp(std::chrono::system_clock::now() + std::chrono::seconds(grace));
  m["deletionGracePeriodSeconds"] = grace;
  if (!finalizers.empty()) m["finalizers"] = finalizers;
  if (is_namespace) obj["status"]["phase"] = "Terminating";
  json stored = CommitPut(storage_key, ns, name, obj, &before);

  if (is_namespace) {
    std::vector<std::tuple<std::string, std::string, std::string>> contents;
    for (const auto& [sk, b] : objects_) {
      for (auto oit = b.lower_bound(name + "/"); oit != b.end(); ++oit) {
        if (oit->first.compare(0, name.size() + 1, name + "/") != 0) break;
        contents.emplace_back(sk, name, Str(MetaOf(oit->second), "name"));
      }
    }
    DeleteOptions background;
    background.propagation = "Background";
    for (const auto& [sk, cns, cname] : contents) {
      if (objects_[sk].count(Key(cns, cname))) DeleteLocked(sk, cns, cname, background);
    }
    CheckNamespaceFinalization(name);
  }
  for (const auto& [dsk, dns, dname] : deps) {
    if (!objects_[dsk].count(Key(dns, dname))) continue;
    DeleteOptions background;
    background.propagation = "Background";
    DeleteLocked(dsk, dns, dname, background);
  }
  if (!deps.empty()) {
    // Re-check with a synthetic dependent naming the owner, in case nothing blocked it.
    json probe = {{"metadata", {{"ownerReferences", {{{"uid", uid}}}}}}};
    CheckForegroundOwners(probe);
  }
  auto again = objects_[storage_key].find(Key(ns, name));
  return again == objects_[storage_key].end() ? stored : again->second;
}

std::vector<json> Store::DeleteCollection(const ResourceInfo& info, const std::string& ns,
                                          const ListOptions& list, const DeleteOptions& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  auto& bucket = objects_[info.storage_key()];
  for (const auto& [key, obj] : bucket) {
    if (!ns.empty() && Str(MetaOf(obj), "namespace") != ns) continue;
    if (!list.labels.Matches(MetaOf(obj).value("labels", json())) || !list.fields.Matches(obj)) {
      continue;
    }
    names.push_back(key);
  }
  std::vector<json> out;
  for (const auto& key : names) {
    size_t slash = key.find('/');
    std::string ons = key.substr(0, slash), oname = key.substr(slash + 1);
    if (!objects_[info.storage_key()].count(key)) continue;
    out.push_back(ForVersion(info, DeleteLocked(info.storage_key(), ons, oname, opts)));
  }
  return out;
}

json Store::Mutate(const std::string& group, const std::string& plural, const std::string& ns,
                   const std::string& name, const std::function<bool(json&)>& mutate) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sk = group + "/" + plural;
  auto& bucket = objects_[sk];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end()) return nullptr;
  json current = it->second;
  json next = current;
  if (!mutate(next) || next == current) return current;
  json stored = CommitPut(sk, ns, name, next, &current);
  if (ReadyToRemove(sk, stored)) Remove(sk, ns, name);
  return stored;
}

void Store::FinishPodTermination(const std::string& ns, const std::string& name,
                                 const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& bucket = objects_[kPodKey];
  auto it = bucket.find(Key(ns, name));
  if (it == bucket.end() || Str(MetaOf(it->second), "uid") != uid || !Deleting(it->second)) return;
  json before = it->second;
  json obj = before;
  Meta(obj)["deletionGracePeriodSeconds"] = 0;
  json stored = CommitPut(kPodKey, ns, name, obj, &before);
  if (ReadyToRemove(kPodKey, stored)) Remove(kPodKey, ns, name);
}

std::shared_ptr<Watcher> Store::Watch(const ResourceInfo& info, const std::string& ns,
                                      const ListOptions& selectors,
                                      const std::string& resource_version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = std::make_shared<Watcher>();
  w->storage_key_ = info.storage_key();
  w->api_version_ = info.api_version();
  w->namespace_ = ns;
  w->labels_ = selectors.labels;
  w->fields_ = selectors.fields;
  auto matches = [&](const json& o) {
    return w->labels_.Matches(MetaOf(o).value("labels", json())) && w->fields_.Matches(o);
  };
  if (resource_version.empty() || resource_version == "0") {
    for (const auto& [key, obj] : objects_[info.storage_key()]) {
      if (!ns.empty() && Str(MetaOf(obj), "namespace") != ns) continue;
      if (!matches(obj)) continue;
      uint64_t orv = std::stoull(Str(MetaOf(obj), "resourceVersion"));
      w->queue_.push_back(WatchEvent{"ADDED", ForVersion(info, obj), orv});
    }
  } else {
    uint64_t from = 0;
    try {
      from = std::stoull(resource_version);
    } catch (...) {
      throw BadRequestError("invalid resource version \"" + resource_version + "\"");
    }
    if (from < evicted_up_to_) {
      throw GoneError("too old resource version: " + resource_version + " (" +
                      std::to_string(evicted_up_to_ + 1) + ")");
    }
    for (const auto& ev : log_) {
      if (ev.rv <= from || ev.storage_key != w->storage_key_) continue;
      if (!ns.empty() && ev.ns != ns) continue;
      bool now = matches(ev.object);
      bool before = !ev.old_object.is_null() && matches(ev.old_object);
      std::string type = ev.type;
      if (type == "MODIFIED") {
        if (now && !before) type = "ADDED";
        if (!now && before) type = "DELETED";
        if (!now && !before) continue;
      } else if (!now) {
        continue;
      }
      w->queue_.push_back(WatchEvent{type, ForVersion(info, ev.object), ev.rv});
    }
  }
  w->progress_rv_ = rv_;
  watchers_.push_back(w);
  return w;
}

void Store::Emit(Event event) {
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    auto w = it->lock();
    if (!w || w->stopped()) {
      it = watchers_.erase(it);
      continue;
    }
    ++it;
    std::string type;
    if (event.storage_key == w->storage_key_ &&
        (w->namespace_.empty() || event.ns == w->namespace_)) {
      auto matches = [&](const json& o) {
        return w->labels_.Matches(MetaOf(o).value("labels", json())) && w->fields_.Matches(o);
      };
      bool now = matches(event.object);
      bool before = !event.old_object.is_null() && matches(event.old_object);
      if (event.type == "MODIFIED") {
        if (now && before)
          type = "MODIFIED";
        else if (now)
          type = "ADDED";
        else if (before)
          type = "DELETED";
      } else if (now) {
        type = event.type;
      }
    }
    std::lock_guard<std::mutex> lock(w->mu_);
    if (!type.empty()) {
      json obj = event.object;
      obj["apiVersion"] = w->api_version_;
      w->queue_.push_back(WatchEvent{type, std::move(obj), event.rv});
    }
    w->progress_rv_ = event.rv;
    w->cv_.notify_all();
  }
  log_.push_back(std::move(event));
  while (log_.size() > options_.watch_window) {
    evicted_up_to_ = log_.front().rv;
    log_.pop_front();
  }
}

void Store::Compact() {
  std::lock_guard<std::mutex> lock(mu_);
  log_.clear();
  evicted_up_to_ = rv_;
}

void Store::StopAllWatchers() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& weak : watchers_) {
    if (auto w = weak.lock()) w->Stop();
  }
  watchers_.clear();
}

}  // namespace spawnpoint::kubetest
