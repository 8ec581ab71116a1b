// Kubernetes API errors as spawnpoint Status values. A non-2xx answer carries a
// metav1.Status body (reason, message, details.causes, details.retryAfterSeconds); it is
// parsed into an ApiError and mapped to a StatusCode so callers branch on codes, never on
// text. Mapping: 404 NotFound, 409 AlreadyExists/Conflict, 410 Gone (Gone and Expired),
// 400/422 InvalidArgument (terminal; causes are in the message), 401 Unauthenticated,
// 403 Forbidden, 429 and 5xx Unavailable (retryable). Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spawnpoint::kube {

// One entry of metav1.Status details.causes, e.g. {"spec.nodes", "FieldValueInvalid", ...}.
struct StatusCause {
  std::string field;
  std::string reason;
  std::string message;
};

struct ApiError {
  int http_status = 0;
  std::string reason;   // metav1.StatusReason, e.g. "NotFound", "Expired", "Invalid"
  std::string message;  // the server's human-readable message
  std::vector<StatusCause> causes;
  std::optional<std::chrono::seconds> retry_after;  // Retry-After header or details

  StatusCode code() const;
  // "<context>: <reason> (<http status>): <message>[; causes: <field>: <message>, ...]".
  Status ToStatus(const std::string& context) const;
};

// `body` is usually a metav1.Status; anything else (an HTML error page from a proxy) is
// summarised. `retry_after_header` is the raw Retry-After value, empty if absent.
ApiError ParseApiError(int http_status, const std::string& body,
                       const std::string& retry_after_header);

// The ERROR event of a watch carries a metav1.Status object instead of a resource.
ApiError ApiErrorFromStatusObject(const std::string& status_json);

// Seconds form only (the API server never sends the HTTP-date form).
std::optional<std::chrono::seconds> ParseRetryAfter(const std::string& value);

inline bool IsNotFound(const Status& s) { return s.code() == StatusCode::kNotFound; }
inline bool IsAlreadyExists(const Status& s) { return s.code() == StatusCode::kAlreadyExists; }
inline bool IsConflict(const Status& s) { return s.code() == StatusCode::kConflict; }
inline bool IsGone(const Status& s) { return s.code() == StatusCode::kGone; }
inline bool IsInvalid(const Status& s) { return s.code() == StatusCode::kInvalidArgument; }
inline bool IsForbidden(const Status& s) { return s.code() == StatusCode::kForbidden; }
inline bool IsUnauthenticated(const Status& s) { return s.code() == StatusCode::kUnauthenticated; }
// Worth trying again later (429, 5xx, timeouts, connection failures).
inline bool IsRetryable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace spawnpoint::kube
