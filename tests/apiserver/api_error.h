// API errors shaped like the real kube-apiserver's `Status` objects, and the field errors
// that make up a 422 Invalid. Inside the test server the store, schema and patch code throw
// ApiError and the HTTP layer turns it into a Status response, which keeps the many
// failure paths of a request handler short. Plain values; no shared state.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spawnpoint::kubetest {

using json = nlohmann::json;

class ApiError : public std::exception {
 public:
  ApiError(int code, std::string reason, std::string message, json details = nullptr)
      : code_(code),
        reason_(std::move(reason)),
        message_(std::move(message)),
        details_(std::move(details)) {}

  int code() const { return code_; }
  const std::string& reason() const { return reason_; }
  const std::string& message() const { return message_; }
  const json& details() const { return details_; }
  const char* what() const noexcept override { return message_.c_str(); }
  // The `kind: Status` object the real server answers with.
  json ToStatus() const;

 private:
  int code_;
  std::string reason_;
  std::string message_;
  json details_;
};

// One field error, formatted like k8s.io/apimachinery's field.Error.
struct FieldError {
  enum class Type {
    kInvalid,
    kTypeInvalid,
    kRequired,
    kNotSupported,
    kTooLong,
    kTooMany,
    kForbidden
  };
  Type type = Type::kInvalid;
  std::string field;  // "spec.nodes", "spec.items[0].name"
  json value;         // the bad value (ignored for Required/TooLong/Forbidden)
  std::string detail;
  bool omit_value = false;

  std::string Reason() const;  // FieldValueInvalid, FieldValueRequired, ...
  std::string Body() const;    // "Invalid value: 0: spec.nodes in body should be ..."
  std::string ToString() const { return field + ": " + Body(); }
};

// "<resource>[.<group>]" as the real server names a resource in messages.
std::string QualifiedResource(const std::string& group, const std::string& plural);

ApiError NotFoundError(const std::string& group, const std::string& plural,
                       const std::string& name);
ApiError AlreadyExistsError(const std::string& group, const std::string& plural,
                            const std::string& name);
ApiError ConflictError(const std::string& group, const std::string& plural, const std::string& name,
                       const std::string& why);
// The stale-resourceVersion conflict every client must handle.
ApiError StaleConflictError(const std::string& group, const std::string& plural,
                            const std::string& name);
ApiError InvalidError(const std::string& group, const std::string& kind, const std::string& name,
                      const std::vector<FieldError>& errors);
ApiError BadRequestError(const std::string& message);
ApiError GoneError(const std::string& message);
ApiError MethodNotSupportedError(const std::string& group, const std::string& plural,
                                 const std::string& verb);
ApiError ForbiddenError(const std::string& group, const std::string& plural,
                        const std::string& name, const std::string& why);
ApiError InternalServerError(const std::string& why);
ApiError TooManyRequestsError(int retry_after_seconds);

// The message of utilerrors.NewAggregate(errors): repeated messages dropped, a single one as
// it is, several as "[a, b]"; "" for none.
std::string AggregateMessage(const std::vector<std::string>& messages);

// Go's %v rendering of a JSON value in field errors: strings quoted, numbers bare.
std::string FormatGoValue(const json& v);
// A JSON number rendered as Go's %v would (1 → "1", 0.5 → "0.5").
std::string FormatNumber(const json& v);

}  // namespace spawnpoint::kubetest
