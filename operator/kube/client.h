// A Kubernetes API client for generic (JSON) objects, addressed by group/version/resource
// and namespace/name, with the behaviour client-go gives controllers: errors as Status
// values carrying the API's reason (errors.h), a client-side QPS/burst limit, bounded
// retries of 429/5xx (honouring Retry-After) and of connection failures where safe, token
// rotation, and watches as streams of events. Everything time-driven uses the injected
// Clock. Thread-safe: one Client is shared by all informers, workers and the elector.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "operator/kube/config.h"
#include "operator/kube/log.h"
#include "operator/kube/timing.h"
#include "operator/kube/transport.h"

namespace spawnpoint::kube {

using Json = nlohmann::json;

struct GroupVersionResource {
  std::string group;     // "" for the core group (served under /api/v1)
  std::string version;   // "v1"
  std::string resource;  // lower-case plural: "pods"

  // "/api/v1" or "/apis/<group>/<version>".
  std::string ApiPrefix() const;
  // "pods" or "trainingjobs.spawnpoint.dev" (kubectl's spelling).
  std::string ToString() const;
  bool operator==(const GroupVersionResource&) const = default;
};

namespace resources {
inline GroupVersionResource Pods() { return {"", "v1", "pods"}; }
inline GroupVersionResource Services() { return {"", "v1", "services"}; }
inline GroupVersionResource Namespaces() { return {"", "v1", "namespaces"}; }
inline GroupVersionResource ConfigMaps() { return {"", "v1", "configmaps"}; }
inline GroupVersionResource Secrets() { return {"", "v1", "secrets"}; }
inline GroupVersionResource Events() { return {"", "v1", "events"}; }
inline GroupVersionResource ResourceQuotas() { return {"", "v1", "resourcequotas"}; }
inline GroupVersionResource Leases() { return {"coordination.k8s.io", "v1", "leases"}; }
// Volcano's (spec.scheduling.gang volcano).
inline GroupVersionResource PodGroups() {
  return {"scheduling.volcano.sh", "v1beta1", "podgroups"};
}
// Kueue's (spec.scheduling.gang kueue): read only.
inline GroupVersionResource KueueWorkloads() { return {"kueue.x-k8s.io", "v1beta2", "workloads"}; }
inline GroupVersionResource TrainingJobs() {
  return {"spawnpoint.dev", "v1alpha1", "trainingjobs"};
}
}  // namespace resources

struct ListOptions {
  std::string label_selector;  // "app=x,tier!=db,env in (a,b)"
  std::string field_selector;  // "status.phase=Running"
  int64_t limit = 0;           // page size; 0 asks for everything at once
  std::string continue_token;
  // "" reads the latest state (a quorum read); "0" accepts any cached state.
  std::string resource_version;
  std::string resource_version_match;  // "", "NotOlderThan" or "Exact"
};

struct ObjectList {
  std::vector<Json> items;
  std::string resource_version;  // of the list: watch from here
  std::string continue_token;    // non-empty: more pages follow
  std::optional<int64_t> remaining_item_count;
};

struct WatchOptions {
  std::string resource_version;  // events after this one; "" starts with synthetic ADDEDs
  std::string label_selector;
  std::string field_selector;
  bool allow_bookmarks = true;
  // The server ends the watch after this long (the reflector then resumes it), so no
  // single connection lives forever behind a load balancer.
  std::optional<std::chrono::seconds> server_timeout;
  // A stream that delivers nothing (not even a bookmark) for this long is treated as
  // stalled: Next() fails with kDeadlineExceeded.
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(2)};
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark };
const char* WatchEventTypeName(WatchEventType type);

struct WatchEvent {
  WatchEventType type;
  Json object;  // for a bookmark only metadata.resourceVersion is meaningful
};

// One watch connection. Next() is called from one thread; Cancel() from any.
class WatchStream {
 public:
  WatchStream(std::unique_ptr<HttpStream> stream, std::string what);
  ~WatchStream();
  // The next event, or nullopt when the server ended the watch. Errors: an ERROR event as
  // its Status (kGone for 410 Expired/Gone: relist), a stream cut mid-event or broken
  // (kUnavailable), a stall (kDeadlineExceeded); after an error the stream is finished.
  StatusOr<std::optional<WatchEvent>> Next();
  void Cancel();

 private:
  std::unique_ptr<HttpStream> stream_;
  std::string what_;
};

enum class PatchType { kMerge, kStrategicMerge, kJsonPatch };

struct DeleteOptions {
  std::string propagation_policy;  // "", "Background", "Foreground" or "Orphan"
  std::optional<int64_t> grace_period_seconds;
  std::string precondition_uid;  // delete only this incarnation of the name
  std::string precondition_resource_version;
};

struct RetryPolicy {
  int max_attempts = 6;  // including the first
  // No retry starts later than this after the first attempt.
  Clock::Duration max_total = std::chrono::seconds(30);
  Clock::Duration initial_backoff = std::chrono::milliseconds(200);
  Clock::Duration max_backoff = std::chrono::seconds(5);
};

struct ClientOptions {
  double qps = 50;  // <= 0: no client-side limit
  int burst = 100;
  RetryPolicy retry;
  std::chrono::milliseconds request_timeout{30000};
  std::string user_agent = "spawnpoint-operator";
  std::string field_manager;  // sent on writes when set
  Logger logger = StderrLogger();
  // Overrides the token source derived from the RestConfig (tests).
  std::shared_ptr<TokenSource> token_source;
  // Called after every HTTP attempt (each retry too) with the method ("WATCH" for a watch),
  // the status code (0: no answer) and how long it took; from any thread, so it must be
  // thread-safe and cheap. For request metrics.
  std::function<void(const std::string& verb, int code, Clock::Duration took)> on_response;
};

struct CallOptions {
  // Give up (kDeadlineExceeded) rather than wait, retry or hang past this time.
  std::optional<Clock::TimePoint> deadline;
  // Create: dryRun=All, the request is admitted (quota, limits, webhooks) but nothing stored.
  bool dry_run = false;
};

class Client {
 public:
  Client(RestConfig config, std::shared_ptr<HttpTransport> transport, Clock* clock,
         ClientOptions options = {});
  ~Client();

  // A client over the cpprestsdk transport.
  static StatusOr<std::unique_ptr<Client>> Connect(const RestConfig& config,
                                                   ClientOptions options = {},
                                                   Clock* clock = RealClock::Get());

  StatusOr<Json> Get(const GroupVersionResource& gvr, const std::string& ns,
                     const std::string& name, const CallOptions& call = {});
  // One page (or everything when options.limit is 0).
  StatusOr<ObjectList> List(const GroupVersionResource& gvr, const std::string& ns,
                            const ListOptions& options = {}, const CallOptions& call = {});
  // Follows continue tokens until the last page; options.limit is the page size. A 410 in
  // the middle (the continue token expired) fails the whole list with kGone.
  StatusOr<ObjectList> ListAll(const GroupVersionResource& gvr, const std::string& ns,
                               ListOptions options = {}, const CallOptions& call = {});
  // The namespace comes from the object's metadata (none for cluster-scoped resources).
  StatusOr<Json> Create(const GroupVersionResource& gvr, const Json& object,
                        const CallOptions& call = {});
  // Replaces the object; its metadata.resourceVersion, if set, is a precondition
  // (kConflict when stale).
  StatusOr<Json> Update(const GroupVersionResource& gvr, const Json& object,
                        const CallOptions& call = {});
  // As Update, on the status subresource.
  StatusOr<Json> UpdateStatus(const GroupVersionResource& gvr, const Json& object,
                              const CallOptions& call = {});
  StatusOr<Json> Patch(const GroupVersionResource& gvr, const std::string& ns,
                       const std::string& name, const Json& patch,
                       PatchType type = PatchType::kMerge, const std::string& subresource = "",
                       const CallOptions& call = {});
  // Returns what the server answered: the object (still terminating) or a Status.
  StatusOr<Json> Delete(const GroupVersionResource& gvr, const std::string& ns,
                        const std::string& name, const DeleteOptions& options = {},
                        const CallOptions& call = {});
  // Opens a watch. Not retried here: the reflector owns the resume and relist logic.
  StatusOr<std::unique_ptr<WatchStream>> Watch(const GroupVersionResource& gvr,
                                               const std::string& ns, const WatchOptions& options);

  const std::string& default_namespace() const { return config_.default_namespace; }
  const std::string& server() const { return config_.server; }
  Clock* clock() const { return clock_; }
  const Logger& logger() const { return options_.logger; }

  // "/api/v1/namespaces/ns/pods/name/status"; empty parts are left out.
  static std::string ResourcePath(const GroupVersionResource& gvr, const std::string& ns,
                                  const std::string& name = "",
                                  const std::string& subresource = "");
  static std::string EscapeQueryValue(const std::string& value);

 private:
  // Sends with rate limiting, authentication and retries; returns the 2xx response or the
  // error. `context` ("GET /api/v1/...") prefixes error messages.
  StatusOr<HttpResponse> Do(const std::string& method, const std::string& target,
                            const std::string& body, const std::string& content_type,
                            const CallOptions& call);
  StatusOr<Json> DoJson(const std::string& method, const std::string& target,
                        const std::string& body, const std::string& content_type,
                        const CallOptions& call);
  Status Authorize(Headers* headers);
  std::string WriteQuery() const;

  const RestConfig config_;
  const std::shared_ptr<HttpTransport> transport_;
  Clock* const clock_;
  const ClientOptions options_;
  std::shared_ptr<TokenSource> token_source_;
  TokenBucket limiter_;
};

// metadata.namespace + "/" + metadata.name, or the name alone for cluster-scoped objects:
// the key informers, stores and work queues use.
std::string ObjectKey(const Json& object);
// Splits "ns/name" (or "name") back into its parts.
std::pair<std::string, std::string> SplitKey(const std::string& key);
// metadata.resourceVersion, metadata.uid, metadata.name, metadata.namespace ("" if absent).
std::string ResourceVersionOf(const Json& object);
std::string UidOf(const Json& object);
std::string NameOf(const Json& object);
std::string NamespaceOf(const Json& object);

}  // namespace spawnpoint::kube
