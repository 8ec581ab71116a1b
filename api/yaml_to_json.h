// Internal to api/: converts a YAML stream into JSON documents and remembers where in the
// text every value (and every mapping key) came from, so that errors found later, while
// decoding the JSON, can point at a line and column.
//
// Plain (unquoted) scalars resolve the way kubectl resolves them (sigs.k8s.io/yaml, YAML
// 1.1 rules), so a manifest means the same to the agent as to the API server: 2 is an
// integer, 2.5 a float, true/false/yes/no/on/off booleans, ~/null/empty null, 0644 octal,
// anything else a string. Quoted and block scalars are always strings.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/field_path.h"
#include "common/status.h"

namespace spawnpoint::api {

struct SourcePosition {
  int line = 1;    // 1-based
  int column = 1;  // 1-based
};

// Where each value of one document is, keyed by JSON pointer.
class SourceMap {
 public:
  void Add(const FieldPath& path, SourcePosition value, std::optional<SourcePosition> key);

  // The position of `path`'s value (or of its key, when `at_key` and it has one). A path that
  // is not in the document (a missing field) resolves to the key of its closest existing
  // ancestor, which is where the user has to add it.
  SourcePosition Locate(const FieldPath& path, bool at_key) const;

 private:
  struct Entry {
    SourcePosition value;
    std::optional<SourcePosition> key;
  };
  std::unordered_map<std::string, Entry> entries_;
};

struct YamlDocument {
  int number = 0;  // 1-based position in the stream
  nlohmann::json value;
  SourceMap positions;
};

// Every document of the stream, empty ones (null) included so numbering matches the text.
// Errors are kInvalidArgument, "SOURCE:LINE:COL: message".
StatusOr<std::vector<YamlDocument>> ParseYamlStream(std::string_view text,
                                                    const std::string& source);

}  // namespace spawnpoint::api
