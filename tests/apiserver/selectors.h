// Label and field selectors with the real API server's syntax:
//   labels: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, comma = AND
//   fields: `path=value`, `path==value`, `path!=value`, comma = AND
// Parse errors are ApiError 400 with the server's wording. Immutable after parsing, so a
// parsed selector may be shared between threads.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spawnpoint::kubetest {

class LabelSelector {
 public:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };

  // Throws ApiError(400) on a syntax error. An empty string selects everything.
  static LabelSelector Parse(const std::string& text);
  // Builds one from a metav1.LabelSelector object ({matchLabels, matchExpressions}).
  static LabelSelector FromJson(const nlohmann::json& selector);

  // `labels` is metadata.labels (an object, or null).
  bool Matches(const nlohmann::json& labels) const;
  bool empty() const { return reqs_.empty(); }
  const std::vector<Requirement>& requirements() const { return reqs_; }

 private:
  std::vector<Requirement> reqs_;
};

class FieldSelector {
 public:
  struct Requirement {
    std::string field;
    bool equals;
    std::string value;
  };

  // Throws ApiError(400) on a syntax error, or when a field is not in `supported` (the
  // real server only allows a few fields per resource); an empty `supported` allows any.
  static FieldSelector Parse(const std::string& text, const std::vector<std::string>& supported);

  bool Matches(const nlohmann::json& object) const;
  bool empty() const { return reqs_.empty(); }
  const std::vector<Requirement>& requirements() const { return reqs_; }
  // The value required by `field=value`, if the selector pins it (used for name watches).
  std::string Pinned(const std::string& field) const;

 private:
  std::vector<Requirement> reqs_;
};

// The string value of a dotted field path of an object as field selectors see it: strings
// as they are, numbers and booleans printed, missing fields empty.
std::string FieldValue(const nlohmann::json& object, const std::string& dotted_path);

}  // namespace spawnpoint::kubetest
