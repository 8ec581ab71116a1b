#include "api/field_path.h"

namespace spawnpoint::api {

FieldPath FieldPath::operator/(std::string_view key) const {
  FieldPath out = *this;
  out.tokens_.emplace_back(std::string(key));
  return out;
}

FieldPath FieldPath::Index(size_t index) const {
  FieldPath out = *this;
  out.tokens_.emplace_back(index);
  return out;
}

FieldPath FieldPath::Parent() const {
  FieldPath out = *this;
  if (!out.tokens_.empty()) out.tokens_.pop_back();
  return out;
}

std::string FieldPath::Dotted() const {
  std::string out;
  for (const auto& token : tokens_) {
    if (const auto* key = std::get_if<std::string>(&token)) {
      if (!out.empty()) out += '.';
      out += *key;
    } else {
      out += '[' + std::to_string(std::get<size_t>(token)) + ']';
    }
  }
  return out;
}

std::string FieldPath::Pointer() const {
  std::string out;
  for (const auto& token : tokens_) {
    out += '/';
    if (const auto* key = std::get_if<std::string>(&token)) {
      for (char c : *key) {
        if (c == '~') {
          out += "~0";
        } else if (c == '/') {
          out += "~1";
        } else {
          out += c;
        }
      }
    } else {
      out += std::to_string(std::get<size_t>(token));
    }
  }
  return out;
}

}  // namespace spawnpoint::api
