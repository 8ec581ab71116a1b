// Internal to api/: a strict reader of JSON objects whose errors name the field, say what is
// allowed and suggest what the user most likely meant ("did you mean"). It keeps the path of
// the first problem so that YAML callers can turn it into a line and column. The schema of a
// particular object (which fields, which ranges) lives with its decoder, not here.
// A FieldReader is not thread-safe; the free functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/field_path.h"
#include "common/status.h"

namespace spawnpoint::api {

// A member of an object, with its path. `value` is null when the member is absent or null:
// Kubernetes treats an explicit null like an omitted field.
struct Field {
  const nlohmann::json* value;
  FieldPath path;
};

Field Get(const nlohmann::json& object, const FieldPath& object_path, std::string_view key);

// "string \"two\"", "number 2.5", "boolean true", "null", "a list", "an object".
std::string Describe(const nlohmann::json& value);
// JSON string syntax; invalid UTF-8 from the input is shown as U+FFFD rather than throwing.
std::string Quote(std::string_view s);
std::string Join(std::span<const std::string_view> items);
// Lowercase without '_' and '-', so that prefetch_factor and PrefetchFactor match
// prefetchFactor.
std::string Normalize(std::string_view s);
// The candidate `word` was most likely meant to be, if any is close enough.
std::optional<std::string_view> Suggest(std::string_view word,
                                        std::span<const std::string_view> candidates);
// RFC 1123 label when first_may_be_digit, else RFC 1035: [a-z0-9]([-a-z0-9]*[a-z0-9])?
bool IsDnsLabel(std::string_view s, bool first_may_be_digit);

inline constexpr int64_t kIntMax = std::numeric_limits<int>::max();
inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

class FieldReader {
 public:
  // For an unknown `key` in the object at dotted path `here`: " (did you mean X?)" when it
  // belongs to another object of the schema, else "".
  using MisplacedHint = std::function<std::string(std::string_view key, std::string_view here)>;

  // `from_yaml` adds hints that only make sense in YAML text.
  FieldReader(bool from_yaml, MisplacedHint misplaced)
      : from_yaml_(from_yaml), misplaced_(std::move(misplaced)) {}

  // Where the first problem is; at_key: the key itself (an unknown field), not its value.
  const FieldPath& error_path() const { return error_path_; }
  bool error_at_key() const { return error_at_key_; }

  // Records `path` as the problem's place and returns kInvalidArgument "path: what".
  Status Fail(const FieldPath& path, const std::string& what, bool at_key = false);
  // "must be <expected>, got <what it is>".
  Status WrongType(const Field& field, const std::string& expected);

  Status CheckObject(const nlohmann::json& value, const FieldPath& path, const std::string& what,
                     std::span<const std::string_view> allowed);
  // Every key of `object` is one of `allowed`.
  Status CheckFields(const nlohmann::json& object, const FieldPath& path,
                     std::span<const std::string_view> allowed);
  Status RequireObject(const Field& field, const std::string& what);

  // The Read* methods leave *out alone when the field is absent.
  Status ReadInt64(const Field& field, int64_t min, int64_t max, int64_t* out);
  template <typename T>
  Status ReadInt(const Field& field, int64_t min, int64_t max, T* out) {
    if (!field.value) return Status::Ok();
    int64_t value = 0;
    SP_RETURN_IF_ERROR(ReadInt64(field, min, max, &value));
    *out = static_cast<T>(value);
    return Status::Ok();
  }
  // Absent: *out becomes nullopt.
  Status ReadOptionalInt64(const Field& field, int64_t min, std::optional<int64_t>* out);
  Status ReadBool(const Field& field, bool* out);
  Status ReadString(const Field& field, std::string* out);
  Status ReadStringList(const Field& field, std::vector<std::string>* out);
  // A string that must be one of `allowed`; *index is its position there.
  Status ReadChoice(const Field& field, std::span<const std::string_view> allowed, size_t* index);
  template <typename E>
  Status ReadEnum(const Field& field, std::span<const std::string_view> names, E* out) {
    if (!field.value) return Status::Ok();
    size_t index = 0;
    SP_RETURN_IF_ERROR(ReadChoice(field, names, &index));
    *out = static_cast<E>(index);
    return Status::Ok();
  }

 private:
  const bool from_yaml_;
  const MisplacedHint misplaced_;
  FieldPath error_path_;
  bool error_at_key_ = false;
};

}  // namespace spawnpoint::api
