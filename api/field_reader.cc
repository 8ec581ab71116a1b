#include "api/field_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace spawnpoint::api {

using nlohmann::json;

// Lowercase without '_' and '-', so that prefetch_factor and PrefetchFactor match
// prefetchFactor.
std::string Normalize(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '_' || c == '-') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate `word` was most likely meant to be, if any is close enough.
std::optional<std::string_view> Suggest(std::string_view word,
                                        std::span<const std::string_view> candidates) {
  std::string w = Normalize(word);
  std::optional<std::string_view> best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : candidates) {
    std::string c = Normalize(candidate);
    size_t distance = EditDistance(w, c);
    size_t limit = w.size() <= 4 ? 1 : w.size() <= 8 ? 2 : 3;
    // "workers" for "workersPerRank": a clear prefix is as good as a typo.
    bool prefix = w.size() >= 4 && c.starts_with(w);
    if ((distance <= limit || prefix) && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string Join(std::span<const std::string_view> items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// JSON string syntax; invalid UTF-8 from the input is shown as U+FFFD rather than throwing.
std::string Quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// "string \"two\"", "number 2.5", "boolean true", "null", "a list", "an object".
std::string Describe(const json& value) {
  switch (value.type()) {
    case json::value_t::string: {
      std::string s = value.get<std::string>();
      if (s.size() > 60) s = s.substr(0, 57) + "...";
      return "string " + Quote(s);
    }
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "number " + value.dump();
    case json::value_t::boolean:
      return std::string("boolean ") + (value.get<bool>() ? "true" : "false");
    case json::value_t::null:
      return "null";
    case json::value_t::array:
      return "a list";
    case json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

bool IsLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// RFC 1123 label when first_may_be_digit, else RFC 1035: [a-z0-9]([-a-z0-9]*[a-z0-9])?
bool IsDnsLabel(std::string_view s, bool first_may_be_digit) {
  if (s.empty()) return false;
  if (!IsLower(s.front()) && !(first_may_be_digit && IsDigit(s.front()))) return false;
  if (!IsLower(s.back()) && !IsDigit(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return IsLower(c) || IsDigit(c) || c == '-'; });
}

Field Get(const json& object, const FieldPath& object_path, std::string_view key) {
  auto it = object.find(key);
  const json* value = (it == object.end() || it->is_null()) ? nullptr : &*it;
  return {value, object_path / key};
}

Status FieldReader::Fail(const FieldPath& path, const std::string& what, bool at_key) {
  error_path_ = path;
  error_at_key_ = at_key;
  return InvalidArgument(path.empty() ? what : path.Dotted() + ": " + what);
}

Status FieldReader::WrongType(const Field& field, const std::string& expected) {
  // "; got" keeps the value apart from a list of allowed values.
  std::string separator = expected.find(',') == std::string::npos ? ", got " : "; got ";
  std::string message = "must be " + expected + separator + Describe(*field.value);
  if (from_yaml_ && expected.starts_with("a string") && field.value->is_primitive() &&
      !field.value->is_null()) {
    message += " (quote it to make it a string)";
  }
  return Fail(field.path, message);
}

Status FieldReader::CheckObject(const json& value, const FieldPath& path, const std::string& what,
                                std::span<const std::string_view> allowed) {
  if (!value.is_object()) {
    return Fail(path, "must be an object (" + what + "), got " + Describe(value));
  }
  return CheckFields(value, path, allowed);
}

Status FieldReader::CheckFields(const json& object, const FieldPath& path,
                                std::span<const std::string_view> allowed) {
  for (const auto& [key, unused] : object.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string hint = misplaced_ ? misplaced_(key, path.Dotted()) : "";
    if (hint.empty()) {
      if (auto guess = Suggest(key, allowed)) hint = " (did you mean " + Quote(*guess) + "?)";
    }
    return Fail(path / key, "unknown field" + hint + "; allowed: " + Join(allowed),
                /*at_key=*/true);
  }
  return Status::Ok();
}

Status FieldReader::ReadInt64(const Field& field, int64_t min, int64_t max, int64_t* out) {
  const json& v = *field.value;
  int64_t value = 0;
  bool above_int64 = false;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    above_int64 = u > static_cast<uint64_t>(kInt64Max);
    value = above_int64 ? kInt64Max : static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::trunc(v.get<double>()) && std::abs(v.get<double>()) < 9.2e18) {
    // 2.0 is an integer to kubectl too (YAML floats become JSON numbers).
    value = static_cast<int64_t>(v.get<double>());
  } else {
    return WrongType(field, "an integer");
  }
  if (value < min || value > max || above_int64) {
    std::string got = v.dump();
    if (max != kInt64Max && max != kIntMax) {
      return Fail(field.path, "must be between " + std::to_string(min) + " and " +
                                  std::to_string(max) + ", got " + got);
    }
    if (value < min) return Fail(field.path, "must be >= " + std::to_string(min) + ", got " + got);
    return Fail(field.path, "must be <= " + std::to_string(max) + ", got " + got);
  }
  *out = value;
  return Status::Ok();
}

Status FieldReader::ReadOptionalInt64(const Field& field, int64_t min,
                                      std::optional<int64_t>* out) {
  if (!field.value) {
    *out = std::nullopt;
    return Status::Ok();
  }
  int64_t value = 0;
  SP_RETURN_IF_ERROR(ReadInt64(field, min, kInt64Max, &value));
  *out = value;
  return Status::Ok();
}

Status FieldReader::ReadBool(const Field& field, bool* out) {
  if (!field.value) return Status::Ok();
  if (!field.value->is_boolean()) return WrongType(field, "a boolean (true or false)");
  *out = field.value->get<bool>();
  return Status::Ok();
}

Status FieldReader::ReadString(const Field& field, std::string* out) {
  if (!field.value) return Status::Ok();
  if (!field.value->is_string()) return WrongType(field, "a string");
  *out = field.value->get<std::string>();
  return Status::Ok();
}

Status FieldReader::ReadStringList(const Field& field, std::vector<std::string>* out) {
  if (!field.value) return Status::Ok();
  if (!field.value->is_array()) return WrongType(field, "a list of strings");
  out->clear();
  for (size_t i = 0; i < field.value->size(); ++i) {
    std::string item;
    SP_RETURN_IF_ERROR(ReadString({&(*field.value)[i], field.path.Index(i)}, &item));
    out->push_back(std::move(item));
  }
  return Status::Ok();
}

Status FieldReader::ReadChoice(const Field& field, std::span<const std::string_view> allowed,
                               size_t* index) {
  std::string expected = "one of " + Join(allowed);
  if (!field.value->is_string()) return WrongType(field, expected);
  std::string value = field.value->get<std::string>();
  auto it = std::find(allowed.begin(), allowed.end(), value);
  if (it != allowed.end()) {
    *index = static_cast<size_t>(it - allowed.begin());
    return Status::Ok();
  }
  std::string hint;
  if (auto guess = Suggest(value, allowed)) hint = " (did you mean " + Quote(*guess) + "?)";
  return Fail(field.path, "must be " + expected + "; got " + Quote(value) + hint);
}

Status FieldReader::RequireObject(const Field& field, const std::string& what) {
  if (!field.value) return Fail(field.path, "required; " + what);
  if (!field.value->is_object()) return WrongType(field, "an object (" + what + ")");
  return Status::Ok();
}

}  // namespace spawnpoint::api
