// Errors as values. A Status is OK or carries a code and a one-line message; StatusOr<T>
// holds either a T or a non-OK Status. Both are plain values: copy them freely. Not
// thread-safe to mutate concurrently (like any value type).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace spawnpoint {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input (a manifest, a flag): exit code 2, never retried
  kNotFound,
  kAlreadyExists,
  kFailedPrecondition,  // the world is not as required (no GPU, /dev/shm too small)
  kResourceExhausted,
  kUnavailable,  // retryable (429, 5xx, connection refused)
  kConflict,     // 409: requeue
  kDeadlineExceeded,
  kInternal,
  kGone,             // 410 Gone/Expired: a watch or list resourceVersion is too old; relist
  kForbidden,        // 403: authenticated but not allowed (RBAC); not retried
  kUnauthenticated,  // 401: credentials missing, wrong or expired; not retried
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message".
  Status WithPrefix(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "StatusOr constructed from an OK Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace spawnpoint

#define SP_RETURN_IF_ERROR(expr)       \
  do {                                 \
    ::spawnpoint::Status _st = (expr); \
    if (!_st.ok()) return _st;         \
  } while (0)

#define SP_CONCAT_INNER(a, b) a##b
#define SP_CONCAT(a, b) SP_CONCAT_INNER(a, b)
#define SP_ASSIGN_OR_RETURN(lhs, expr) \
  SP_ASSIGN_OR_RETURN_IMPL(SP_CONCAT(_sor_, __LINE__), lhs, expr)
#define SP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
