#include "operator/kube/errors.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

namespace spawnpoint::kube {
namespace {

// Error pages from proxies can be large; a status message only needs the gist.
constexpr size_t kMaxMessage = 1024;

std::string Truncate(std::string s) {
  if (s.size() > kMaxMessage) {
    s.resize(kMaxMessage);
    s += "...";
  }
  return s;
}

std::string DefaultReason(int http_status) {
  switch (http_status) {
    case 400:
      return "BadRequest";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 405:
      return "MethodNotAllowed";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 415:
      return "UnsupportedMediaType";
    case 422:
      return "Invalid";
    case 429:
      return "TooManyRequests";
    case 500:
      return "InternalError";
    case 503:
      return "ServiceUnavailable";
    case 504:
      return "Timeout";
    default:
      return http_status >= 500 ? "InternalError" : "Unknown";
  }
}

// The string at `key` of object `j`, or "" when it is missing or not a string: a Status
// comes from whatever answered (a proxy too), so no field's type is taken on trust.
std::string StringField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void FillFromStatus(const nlohmann::json& st, ApiError* e) {
  if (!st.is_object()) return;
  if (auto it = st.find("reason"); it != st.end() && it->is_string() && !it->empty()) {
    e->reason = it->get<std::string>();
  }
  if (auto it = st.find("message"); it != st.end() && it->is_string()) {
    e->message = Truncate(it->get<std::string>());
  }
  if (e->http_status == 0) {
    if (auto it = st.find("code"); it != st.end() && it->is_number_integer()) {
      e->http_status = it->get<int>();
    }
  }
  auto details = st.find("details");
  if (details == st.end() || !details->is_object()) return;
  if (auto it = details->find("retryAfterSeconds");
      it != details->end() && it->is_number_integer() && !e->retry_after) {
    // As the Retry-After header (ParseRetryAfter): at most 9 digits, so that it converts to
    // the clock's nanoseconds without overflow; a negative one is none.
    constexpr int64_t kMax = 999999999;
    const int64_t seconds =
        it->is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), kMax))
            : std::min<int64_t>(it->get<int64_t>(), kMax);
    if (seconds >= 0) e->retry_after = std::chrono::seconds(seconds);
  }
  if (auto it = details->find("causes"); it != details->end() && it->is_array()) {
    for (const auto& c : *it) {
      if (!c.is_object()) continue;
      StatusCause cause;
      cause.field = StringField(c, "field");
      cause.reason = StringField(c, "reason");
      cause.message = Truncate(StringField(c, "message"));
      e->causes.push_back(std::move(cause));
    }
  }
}

}  // namespace

std::optional<std::chrono::seconds> ParseRetryAfter(const std::string& value) {
  size_t b = 0, e = value.size();
  while (b < e && std::isspace(static_cast<unsigned char>(value[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(value[e - 1]))) --e;
  if (b == e || e - b > 9) return std::nullopt;
  int64_t n = 0;
  for (size_t i = b; i < e; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(value[i]))) return std::nullopt;
    n = n * 10 + (value[i] - '0');
  }
  return std::chrono::seconds(n);
}

ApiError ParseApiError(int http_status, const std::string& body,
                       const std::string& retry_after_header) {
  ApiError e;
  e.http_status = http_status;
  e.retry_after = ParseRetryAfter(retry_after_header);
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && StringField(j, "kind") == "Status") {
    FillFromStatus(j, &e);
  } else if (!body.empty()) {
    std::string gist;
    for (char c : body.substr(0, 200))
      gist += std::isprint(static_cast<unsigned char>(c)) ? c : ' ';
    e.message = "unexpected response body: " + gist;
  }
  if (e.reason.empty()) e.reason = DefaultReason(http_status);
  return e;
}

ApiError ApiErrorFromStatusObject(const std::string& status_json) {
  ApiError e;
  auto j = nlohmann::json::parse(status_json, nullptr, false);
  FillFromStatus(j, &e);
  if (e.reason.empty()) e.reason = DefaultReason(e.http_status);
  return e;
}

StatusCode ApiError::code() const {
  if (reason == "Expired" || reason == "Gone" || http_status == 410) return StatusCode::kGone;
  switch (http_status) {
    case 400:
    case 405:
    case 406:
    case 413:
    case 415:
    case 422:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kForbidden;
    case 404:
      return StatusCode::kNotFound;
    case 409:
      return reason == "AlreadyExists" ? StatusCode::kAlreadyExists : StatusCode::kConflict;
    case 429:
      return StatusCode::kUnavailable;
    default:
      break;
  }
  if (http_status >= 500 && http_status < 600) return StatusCode::kUnavailable;
  if (http_status >= 400 && http_status < 500) return StatusCode::kInvalidArgument;
  return StatusCode::kInternal;
}

Status ApiError::ToStatus(const std::string& context) const {
  std::string m = context.empty() ? "" : context + ": ";
  m += reason.empty() ? "Error" : reason;
  if (http_status != 0) m += " (" + std::to_string(http_status) + ")";
  if (!message.empty()) m += ": " + message;
  if (!causes.empty()) {
    m += "; causes: ";
    for (size_t i = 0; i < causes.size(); ++i) {
      if (i) m += ", ";
      const auto& c = causes[i];
      m += c.field.empty() ? c.message : c.field + ": " + c.message;
      if (!c.reason.empty()) m += " (" + c.reason + ")";
    }
  }
  if (retry_after) m += "; retry after " + std::to_string(retry_after->count()) + "s";
  return Status(code(), std::move(m));
}

}  // namespace spawnpoint::kube
