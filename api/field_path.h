// Internal to api/: the path of a field inside a document, e.g.
// spec.template.spec.containers[0].command. Messages show it dotted; as a JSON pointer it keys
// the source positions recorded for YAML input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace spawnpoint::api {

class FieldPath {
 public:
  FieldPath() = default;

  FieldPath operator/(std::string_view key) const;
  FieldPath Index(size_t index) const;
  // The root's parent is the root.
  FieldPath Parent() const;
  bool empty() const { return tokens_.empty(); }

  std::string Dotted() const;   // "spec.loader.seed", "spec.template.spec.containers[0]"
  std::string Pointer() const;  // RFC 6901: "/spec/loader/seed"

  bool operator==(const FieldPath&) const = default;

 private:
  std::vector<std::variant<std::string, size_t>> tokens_;
};

}  // namespace spawnpoint::api
