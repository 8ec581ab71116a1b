#include "operator/kube/client.h"

#include <algorithm>

#include "operator/kube/cpprest_transport.h"
#include "operator/kube/errors.h"

namespace spawnpoint::kube {
namespace {

const char* kJson = "application/json";

bool IsIdempotent(const std::string& method) {
  return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE" ||
         method == "OPTIONS";
}

std::string EscapePathSegment(const std::string& s) { return Client::EscapeQueryValue(s); }

void AddParam(std::string* target, const std::string& key, const std::string& value) {
  if (value.empty()) return;
  *target += target->find('?') == std::string::npos ? '?' : '&';
  *target += key + "=" + Client::EscapeQueryValue(value);
}

std::string MetaString(const Json& object, const char* field) {
  auto m = object.find("metadata");
  if (m == object.end() || !m->is_object()) return "";
  auto f = m->find(field);
  if (f == m->end() || !f->is_string()) return "";
  return f->get<std::string>();
}

Clock::Duration Min(Clock::Duration a, Clock::Duration b) { return a < b ? a : b; }

}  // namespace

std::string GroupVersionResource::ApiPrefix() const {
  if (group.empty()) return "/api/" + version;
  return "/apis/" + group + "/" + version;
}

std::string GroupVersionResource::ToString() const {
  return group.empty() ? resource : resource + "." + group;
}

const char* WatchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
  }
  return "?";
}

std::string ObjectKey(const Json& object) {
  std::string ns = MetaString(object, "namespace");
  std::string name = MetaString(object, "name");
  return ns.empty() ? name : ns + "/" + name;
}

std::pair<std::string, std::string> SplitKey(const std::string& key) {
  auto slash = key.find('/');
  if (slash == std::string::npos) return {"", key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

std::string ResourceVersionOf(const Json& object) { return MetaString(object, "resourceVersion"); }
std::string UidOf(const Json& object) { return MetaString(object, "uid"); }
std::string NameOf(const Json& object) { return MetaString(object, "name"); }
std::string NamespaceOf(const Json& object) { return MetaString(object, "namespace"); }

WatchStream::WatchStream(std::unique_ptr<HttpStream> stream, std::string what)
    : stream_(std::move(stream)), what_(std::move(what)) {}

WatchStream::~WatchStream() = default;

void WatchStream::Cancel() { stream_->Cancel(); }

StatusOr<std::optional<WatchEvent>> WatchStream::Next() {
  for (;;) {
    auto line = stream_->ReadLine();
    if (!line.ok()) return line.status().WithPrefix(what_);
    if (!line->has_value()) return std::optional<WatchEvent>();
    const std::string& text = **line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string() || !j.contains("object") ||
        !j["object"].is_object()) {
      // A connection cut in the middle of an event leaves half a line; the watch resumes
      // from the last complete event, so nothing is lost.
      return Unavailable(what_ + ": malformed watch event (" + std::to_string(text.size()) +
                         " bytes); the stream was probably cut mid-event");
    }
    const std::string type = j["type"].get<std::string>();
    WatchEvent ev;
    if (type == "ADDED") {
      ev.type = WatchEventType::kAdded;
    } else if (type == "MODIFIED") {
      ev.type = WatchEventType::kModified;
    } else if (type == "DELETED") {
      ev.type = WatchEventType::kDeleted;
    } else if (type == "BOOKMARK") {
      ev.type = WatchEventType::kBookmark;
    } else if (type == "ERROR") {
      return ApiErrorFromStatusObject(j["object"].dump()).ToStatus(what_ + ": ERROR event");
    } else {
      return Internal(what_ + ": unknown watch event type \"" + type + "\"");
    }
    ev.object = std::move(j["object"]);
    return std::optional<WatchEvent>(std::move(ev));
  }
}

Client::Client(RestConfig config, std::shared_ptr<HttpTransport> transport, Clock* clock,
               ClientOptions options)
    : config_(std::move(config)),
      transport_(std::move(transport)),
      clock_(clock),
      options_(std::move(options)),
      limiter_(options_.qps, options_.burst, clock) {
  token_source_ = options_.token_source ? options_.token_source : MakeTokenSource(config_, clock);
}

Client::~Client() = default;

StatusOr<std::unique_ptr<Client>> Client::Connect(const RestConfig& config, ClientOptions options,
                                                  Clock* clock) {
  SP_ASSIGN_OR_RETURN(std::shared_ptr<HttpTransport> transport, NewCpprestTransport(config));
  return std::make_unique<Client>(config, std::move(transport), clock, std::move(options));
}

std::string Client::EscapeQueryValue(const std::string& value) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string Client::ResourcePath(const GroupVersionResource& gvr, const std::string& ns,
                                 const std::string& name, const std::string& subresource) {
  std::string p = gvr.ApiPrefix();
  if (!ns.empty()) p += "/namespaces/" + EscapePathSegment(ns);
  p += "/" + gvr.resource;
  if (!name.empty()) p += "/" + EscapePathSegment(name);
  if (!subresource.empty()) p += "/" + subresource;
  return p;
}

Status Client::Authorize(Headers* headers) {
  if (token_source_) {
    auto token = token_source_->Token();
    if (!token.ok()) return token.status();
    (*headers)["authorization"] = "Bearer " + *token;
  } else if (!config_.username.empty()) {
    (*headers)["authorization"] =
        "Basic " + Base64Encode(config_.username + ":" + config_.password);
  }
  return Status::Ok();
}

std::string Client::WriteQuery() const {
  if (options_.field_manager.empty()) return "";
  return "?fieldManager=" + EscapeQueryValue(options_.field_manager);
}

StatusOr<HttpResponse> Client::Do(const std::string& method, const std::string& target,
                                  const std::string& body, const std::string& content_type,
                                  const CallOptions& call) {
  const std::string context = method + " " + target;
  const RetryPolicy& rp = options_.retry;
  const auto start = clock_->Now();
  auto give_up_at = start + rp.max_total;
  if (call.deadline && *call.deadline < give_up_at) give_up_at = *call.deadline;
  Clock::Duration backoff = rp.initial_backoff;
  bool reauthenticated = false;
  for (int attempt = 1;; ++attempt) {
    auto go_at = limiter_.Reserve();
    if (call.deadline && go_at > *call.deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    context + ": the client rate limit would delay the request past its deadline");
    }
    if (go_at > clock_->Now()) clock_->SleepUntil(go_at);

    HttpRequest req;
    req.method = method;
    req.target = target;
    req.body = body;
    req.headers["accept"] = kJson;
    req.headers["user-agent"] = options_.user_agent;
    if (!body.empty()) req.headers["content-type"] = content_type;
    SP_RETURN_IF_ERROR(Authorize(&req.headers).WithPrefix(context));
    req.timeout = options_.request_timeout;
    if (call.deadline) {
      auto left = *call.deadline - clock_->Now();
      if (left <= Clock::Duration::zero()) {
        return Status(StatusCode::kDeadlineExceeded, context + ": deadline passed");
      }
      req.timeout = std::min(req.timeout, std::chrono::ceil<std::chrono::milliseconds>(left));
    }

    const auto sent_at = clock_->Now();
    HttpResponse resp = transport_->Send(req);
    if (options_.on_response) options_.on_response(method, resp.status, clock_->Now() - sent_at);
    if (resp.status >= 200 && resp.status < 300) return resp;

    Status error;
    bool retryable = false;
    std::optional<Clock::Duration> retry_after;
    if (resp.status == 0) {
      error = resp.error.WithPrefix(context);
      // A request that never left can always be retried; one that may have been applied
      // only if applying it twice is harmless.
      retryable = IsRetryable(resp.error) && (!resp.request_sent || IsIdempotent(method));
    } else {
      ApiError api = ParseApiError(resp.status, resp.body, resp.Header("retry-after"));
      error = api.ToStatus(context);
      if (resp.status == 401 && token_source_ && !reauthenticated) {
        // The token may have rotated under us: read it again and retry once.
        token_source_->Invalidate();
        reauthenticated = true;
        options_.logger(LogLevel::kInfo, context + ": 401, re-reading the token");
        --attempt;
        continue;
      }
      retryable = resp.status == 429 || (resp.status >= 500 && resp.status < 600);
      if (api.retry_after) retry_after = *api.retry_after;
    }
    if (!retryable) return error;
    if (attempt >= rp.max_attempts) {
      return Status(error.code(),
                    error.message() + " (gave up after " + std::to_string(attempt) + " attempts)");
    }
    Clock::Duration wait = retry_after ? *retry_after : backoff;
    backoff = Min(backoff * 2, rp.max_backoff);
    auto now = clock_->Now();
    if (now + wait > give_up_at) {
      return Status(error.code(), error.message() + " (gave up after " + std::to_string(attempt) +
                                      " attempts: the next retry would pass the retry budget)");
    }
    options_.logger(
        LogLevel::kInfo,
        error.message() + "; retrying in " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()) +
            " ms (attempt " + std::to_string(attempt + 1) + ")");
    clock_->SleepUntil(now + wait);
  }
}

StatusOr<Json> Client::DoJson(const std::string& method, const std::string& target,
                              const std::string& body, const std::string& content_type,
                              const CallOptions& call) {
  SP_ASSIGN_OR_RETURN(HttpResponse resp, Do(method, target, body, content_type, call));
  if (resp.body.empty()) return Json::object();
  auto j = Json::parse(resp.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Internal(method + " " + target + ": the response is not JSON (" +
                    std::to_string(resp.body.size()) + " bytes)");
  }
  return j;
}

StatusOr<Json> Client::Get(const GroupVersionResource& gvr, const std::string& ns,
                           const std::string& name, const CallOptions& call) {
  if (name.empty()) return InvalidArgument("Get " + gvr.ToString() + ": empty name");
  return DoJson("GET", ResourcePath(gvr, ns, name), "", "", call);
}

StatusOr<ObjectList> Client::List(const GroupVersionResource& gvr, const std::string& ns,
                                  const ListOptions& options, const CallOptions& call) {
  std::string target = ResourcePath(gvr, ns);
  AddParam(&target, "labelSelector", options.label_selector);
  AddParam(&target, "fieldSelector", options.field_selector);
  if (options.limit > 0) AddParam(&target, "limit", std::to_string(options.limit));
  AddParam(&target, "continue", options.continue_token);
  AddParam(&target, "resourceVersion", options.resource_version);
  AddParam(&target, "resourceVersionMatch", options.resource_version_match);
  SP_ASSIGN_OR_RETURN(Json j, DoJson("GET", target, "", "", call));
  ObjectList list;
  if (auto it = j.find("items"); it != j.end() && it->is_array()) {
    list.items.reserve(it->size());
    for (auto& item : *it) list.items.push_back(std::move(item));
  } else if (!j.contains("items") || !j["items"].is_null()) {
    return Internal("GET " + target + ": the answer is not a list");
  }
  // Fields of another type read as absent (json::value would throw out of the client).
  list.resource_version = MetaString(j, "resourceVersion");
  list.continue_token = MetaString(j, "continue");
  if (auto m = j.find("metadata"); m != j.end() && m->is_object()) {
    if (auto r = m->find("remainingItemCount"); r != m->end() && r->is_number_integer()) {
      list.remaining_item_count = r->get<int64_t>();
    }
  }
  return list;
}

StatusOr<ObjectList> Client::ListAll(const GroupVersionResource& gvr, const std::string& ns,
                                     ListOptions options, const CallOptions& call) {
  ObjectList all;
  for (;;) {
    SP_ASSIGN_OR_RETURN(ObjectList page, List(gvr, ns, options, call));
    if (all.items.empty()) {
      all.items = std::move(page.items);
    } else {
      all.items.insert(all.items.end(), std::make_move_iterator(page.items.begin()),
                       std::make_move_iterator(page.items.end()));
    }
    // Every page of one paged list is served at the first page's resourceVersion.
    if (all.resource_version.empty()) all.resource_version = page.resource_version;
    if (page.continue_token.empty()) break;
    options.continue_token = page.continue_token;
    // A continued list must not also name a resourceVersion (the token carries it).
    options.resource_version.clear();
    options.resource_version_match.clear();
  }
  return all;
}

StatusOr<Json> Client::Create(const GroupVersionResource& gvr, const Json& object,
                              const CallOptions& call) {
  std::string query = WriteQuery();
  if (call.dry_run) query += (query.empty() ? "?" : "&") + std::string("dryRun=All");
  return DoJson("POST", ResourcePath(gvr, NamespaceOf(object)) + query, object.dump(), kJson, call);
}

StatusOr<Json> Client::Update(const GroupVersionResource& gvr, const Json& object,
                              const CallOptions& call) {
  std::string name = NameOf(object);
  if (name.empty()) return InvalidArgument("Update " + gvr.ToString() + ": object has no name");
  return DoJson("PUT", ResourcePath(gvr, NamespaceOf(object), name) + WriteQuery(), object.dump(),
                kJson, call);
}

StatusOr<Json> Client::UpdateStatus(const GroupVersionResource& gvr, const Json& object,
                                    const CallOptions& call) {
  std::string name = NameOf(object);
  if (name.empty()) {
    return InvalidArgument("UpdateStatus " + gvr.ToString() + ": object has no name");
  }
  return DoJson("PUT", ResourcePath(gvr, NamespaceOf(object), name, "status") + WriteQuery(),
                object.dump(), kJson, call);
}

StatusOr<Json> Client::Patch(const GroupVersionResource& gvr, const std::string& ns,
                             const std::string& name, const Json& patch, PatchType type,
                             const std::string& subresource, const CallOptions& call) {
  if (name.empty()) return InvalidArgument("Patch " + gvr.ToString() + ": empty name");
  const char* content_type = type == PatchType::kMerge ? "application/merge-patch+json"
                             : type == PatchType::kStrategicMerge
                                 ? "application/strategic-merge-patch+json"
                                 : "application/json-patch+json";
  return DoJson("PATCH", ResourcePath(gvr, ns, name, subresource) + WriteQuery(), patch.dump(),
                content_type, call);
}

StatusOr<Json> Client::Delete(const GroupVersionResource& gvr, const std::string& ns,
                              const std::string& name, const DeleteOptions& options,
                              const CallOptions& call) {
  if (name.empty()) return InvalidArgument("Delete " + gvr.ToString() + ": empty name");
  Json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
  if (!options.propagation_policy.empty()) body["propagationPolicy"] = options.propagation_policy;
  if (options.grace_period_seconds) body["gracePeriodSeconds"] = *options.grace_period_seconds;
  if (!options.precondition_uid.empty()) body["preconditions"]["uid"] = options.precondition_uid;
  if (!options.precondition_resource_version.empty()) {
    body["preconditions"]["resourceVersion"] = options.precondition_resource_version;
  }
  return DoJson("DELETE", ResourcePath(gvr, ns, name), body.dump(), kJson, call);
}

StatusOr<std::unique_ptr<WatchStream>> Client::Watch(const GroupVersionResource& gvr,
                                                     const std::string& ns,
                                                     const WatchOptions& options) {
  std::string target = ResourcePath(gvr, ns) + "?watch=true";
  AddParam(&target, "resourceVersion", options.resource_version);
  AddParam(&target, "labelSelector", options.label_selector);
  AddParam(&target, "fieldSelector", options.field_selector);
  if (options.allow_bookmarks) AddParam(&target, "allowWatchBookmarks", "true");
  if (options.server_timeout) {
    AddParam(&target, "timeoutSeconds", std::to_string(options.server_timeout->count()));
  }
  const std::string context = "WATCH " + target;
  limiter_.Wait();
  HttpRequest req;
  req.method = "GET";
  req.target = target;
  req.headers["accept"] = kJson;
  req.headers["user-agent"] = options_.user_agent;
  SP_RETURN_IF_ERROR(Authorize(&req.headers).WithPrefix(context));
  req.timeout = options.idle_timeout;
  std::unique_ptr<HttpStream> stream;
  const auto sent_at = clock_->Now();
  HttpResponse resp = transport_->OpenStream(req, &stream);
  if (options_.on_response) options_.on_response("WATCH", resp.status, clock_->Now() - sent_at);
  if (resp.status == 0) return resp.error.WithPrefix(context);
  if (resp.status < 200 || resp.status >= 300 || !stream) {
    if (resp.status == 401 && token_source_) token_source_->Invalidate();
    return ParseApiError(resp.status, resp.body, resp.Header("retry-after")).ToStatus(context);
  }
  return std::make_unique<WatchStream>(std::move(stream), context);
}

}  // namespace spawnpoint::kube
