// Fault injection and the request log of the API test server.
//
// A fault rule matches requests by verb (get, list, watch, create, update, patch, delete,
// deletecollection or *), resource (a plural such as "pods", "pods/status" for a
// subresource, or *), and optionally namespace and name; it fires for the first `count`
// matches (default: every match), each with probability `rate` (default 1). A rule that
// fires can
//   - answer `code` instead of serving the request (500 InternalError, 429 TooManyRequests
//     with `Retry-After: retryAfter`, 409 Conflict, 503, 410 ... with a real Status body;
//     on a watch, 410 is sent the way the real server does: an ERROR event),
//   - add `latencyMs` before the request is served,
//   - cut a watch stream after `cutAfterEvents` events; with `midLine` the next event is
//     written only half (the chunk announces the whole line) before the connection closes.
// Rules are given as JSON, {"rules":[{...}, ...]} or a bare array, or in the compact form
// used on the command line: rules separated by ';', fields by ',', e.g.
//   verb=list,resource=pods,code=500,count=3;verb=watch,resource=*,cutAfterEvents=2,midLine=true
// Randomness comes from a seeded generator ({"seed": N}, default 1) so runs repeat.
//
// Thread-safety: both classes are internally synchronised.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace spawnpoint::kubetest {

struct FaultRule {
  int id = 0;
  std::string verb = "*";
  std::string resource = "*";
  std::string ns = "*";
  std::string name = "*";
  int code = 0;
  int retry_after = 1;
  int latency_ms = 0;
  int cut_after_events = -1;
  bool mid_line = false;
  int64_t count = -1;  // remaining firings; -1 = unlimited
  double rate = 1.0;
  int64_t fired = 0;

  nlohmann::json ToJson() const;
};

// What the server must do to one request.
struct FaultDecision {
  int code = 0;
  int retry_after = 0;
  int latency_ms = 0;
  int cut_after_events = -1;
  bool mid_line = false;
  std::vector<int> rule_ids;
  std::string Describe() const;  // "" when nothing fired
};

class Faults {
 public:
  // Adds the rules of a JSON or compact spec; returns an error naming the bad field.
  Status Add(const std::string& spec);
  Status AddJson(const nlohmann::json& spec);
  void Clear();
  nlohmann::json ToJson() const;
  // `resource` is "pods" or "pods/status".
  FaultDecision Decide(const std::string& verb, const std::string& resource, const std::string& ns,
                       const std::string& name);

 private:
  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;
  int next_id_ = 1;
  std::mt19937_64 rng_{1};
};

struct RequestRecord {
  uint64_t seq = 0;
  std::string time;  // RFC 3339 with milliseconds
  std::string method;
  std::string verb;  // the Kubernetes verb (get, list, watch, ...), or "" for non-resource paths
  std::string path;
  std::string query;
  std::string group;
  std::string version;
  std::string resource;
  std::string subresource;
  std::string ns;
  std::string name;
  int code = 0;
  std::string fault;
  std::string user_agent;
  double duration_ms = 0;
  std::string user;  // the authenticated (or impersonated) user name; "" when unauthenticated
  bool allowed = false;
  std::string reason;  // why it was (not) allowed: "RBAC: allowed by ...", "invalid bearer token"

  nlohmann::json ToJson() const;
};

class RequestLog {
 public:
  explicit RequestLog(size_t capacity = 100000) : capacity_(capacity) {}
  void Add(RequestRecord record);
  // Records with seq > since.
  nlohmann::json ToJson(uint64_t since) const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::deque<RequestRecord> records_;
  uint64_t next_seq_ = 1;
  size_t capacity_;
};

}  // namespace spawnpoint::kubetest
