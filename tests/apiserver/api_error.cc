#include "tests/apiserver/api_error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace spawnpoint::kubetest {

json ApiError::ToStatus() const {
  json s = {{"kind", "Status"},    {"apiVersion", "v1"},  {"metadata", json::object()},
            {"status", "Failure"}, {"message", message_}, {"reason", reason_},
            {"code", code_}};
  if (!details_.is_null()) s["details"] = details_;
  return s;
}

std::string FieldError::Reason() const {
  switch (type) {
    case Type::kInvalid:
      return "FieldValueInvalid";
    case Type::kTypeInvalid:
      return "FieldValueTypeInvalid";
    case Type::kRequired:
      return "FieldValueRequired";
    case Type::kNotSupported:
      return "FieldValueNotSupported";
    case Type::kTooLong:
      return "FieldValueTooLong";
    case Type::kTooMany:
      return "FieldValueTooMany";
    case Type::kForbidden:
      return "FieldValueForbidden";
  }
  return "FieldValueInvalid";
}

std::string FormatNumber(const json& v) {
  if (v.is_number_integer()) return v.dump();
  double d = v.get<double>();
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) {
    return std::to_string(static_cast<long long>(d));
  }
  char buf[64];
  snprintf(buf, sizeof(buf), "%g", d);
  return buf;
}

std::string FormatGoValue(const json& v) {
  if (v.is_null()) return "\"null\"";
  if (v.is_string()) return json(v.get<std::string>()).dump();
  if (v.is_number()) return FormatNumber(v);
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  // Go prints maps and slices with %#v; JSON is the readable equivalent.
  return v.dump();
}

std::string FieldError::Body() const {
  std::string s;
  switch (type) {
    case Type::kRequired:
      s = "Required value";
      break;
    case Type::kForbidden:
      s = "Forbidden";
      break;
    case Type::kTooLong:
      s = "Too long";
      break;
    case Type::kTooMany:
      s = omit_value ? "Too many" : "Too many: " + FormatGoValue(value);
      break;
    case Type::kNotSupported:
      s = "Unsupported value: " + FormatGoValue(value);
      break;
    case Type::kInvalid:
    case Type::kTypeInvalid:
      s = omit_value ? "Invalid value" : "Invalid value: " + FormatGoValue(value);
      break;
  }
  if (!detail.empty()) s += ": " + detail;
  return s;
}

std::string AggregateMessage(const std::vector<std::string>& messages) {
  std::vector<std::string> unique;
  for (const auto& m : messages) {
    if (std::find(unique.begin(), unique.end(), m) == unique.end()) unique.push_back(m);
  }
  if (unique.empty()) return "";
  if (unique.size() == 1) return unique[0];
  std::string out = "[";
  for (size_t i = 0; i < unique.size(); ++i) out += (i ? ", " : "") + unique[i];
  return out + "]";
}

std::string QualifiedResource(const std::string& group, const std::string& plural) {
  return group.empty() ? plural : plural + "." + group;
}

namespace {
json ResourceDetails(const std::string& group, const std::string& plural, const std::string& name) {
  json d = {{"kind", plural}};
  if (!name.empty()) d["name"] = name;
  if (!group.empty()) d["group"] = group;
  return d;
}
}  // namespace

ApiError NotFoundError(const std::string& group, const std::string& plural,
                       const std::string& name) {
  std::string msg = QualifiedResource(group, plural) + " \"" + name + "\" not found";
  return ApiError(404, "NotFound", msg, ResourceDetails(group, plural, name));
}

ApiError AlreadyExistsError(const std::string& group, const std::string& plural,
                            const std::string& name) {
  std::string msg = QualifiedResource(group, plural) + " \"" + name + "\" already exists";
  return ApiError(409, "AlreadyExists", msg, ResourceDetails(group, plural, name));
}

ApiError ConflictError(const std::string& group, const std::string& plural, const std::string& name,
                       const std::string& why) {
  std::string msg = "Operation cannot be fulfilled on " + QualifiedResource(group, plural) + " \"" +
                    name + "\": " + why;
  return ApiError(409, "Conflict", msg, ResourceDetails(group, plural, name));
}

ApiError StaleConflictError(const std::string& group, const std::string& plural,
                            const std::string& name) {
  return ConflictError(group, plural, name,
                       "the object has been modified; please apply your changes to the latest "
                       "version and try again");
}

ApiError InvalidError(const std::string& group, const std::string& kind, const std::string& name,
                      const std::vector<FieldError>& errors) {
  json causes = json::array();
  std::vector<std::string> seen;
  for (const auto& e : errors) {
    std::string text = e.ToString();
    if (std::find(seen.begin(), seen.end(), text) != seen.end()) continue;
    seen.push_back(text);
    causes.push_back({{"reason", e.Reason()}, {"message", e.Body()}, {"field", e.field}});
  }
  std::string qualified_kind = group.empty() ? kind : kind + "." + group;
  json details = {{"name", name}, {"kind", kind}, {"causes", causes}};
  if (!group.empty()) details["group"] = group;
  return ApiError(422, "Invalid",
                  qualified_kind + " \"" + name + "\" is invalid: " + AggregateMessage(seen),
                  details);
}

ApiError BadRequestError(const std::string& message) {
  return ApiError(400, "BadRequest", message);
}

ApiError GoneError(const std::string& message) { return ApiError(410, "Expired", message); }

ApiError MethodNotSupportedError(const std::string& group, const std::string& plural,
                                 const std::string& verb) {
  return ApiError(
      405, "MethodNotAllowed",
      verb + " is not supported on resources of kind \"" + QualifiedResource(group, plural) + "\"",
      ResourceDetails(group, plural, ""));
}

ApiError ForbiddenError(const std::string& group, const std::string& plural,
                        const std::string& name, const std::string& why) {
  std::string msg = QualifiedResource(group, plural) + " \"" + name + "\" is forbidden: " + why;
  return ApiError(403, "Forbidden", msg, ResourceDetails(group, plural, name));
}

ApiError InternalServerError(const std::string& why) {
  return ApiError(500, "InternalError", "Internal error occurred: " + why,
                  json{{"causes", json::array({{{"message", why}}})}});
}

ApiError TooManyRequestsError(int retry_after_seconds) {
  return ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                  json{{"retryAfterSeconds", retry_after_seconds}});
}

}  // namespace spawnpoint::kubetest
