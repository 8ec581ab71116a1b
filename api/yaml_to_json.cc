#include "api/yaml_to_json.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

namespace spawnpoint::api {
namespace {

using nlohmann::json;

// Aliases share nodes in yaml-cpp, but converting them copies: a few nested aliases can
// expand into billions of values ("billion laughs"). Real manifests are far below this.
constexpr size_t kMaxValues = 100'000;

SourcePosition ToPosition(const YAML::Mark& mark) {
  if (mark.is_null()) return {};
  return {mark.line + 1, mark.column + 1};
}

bool IsOneOf(std::string_view s, std::initializer_list<std::string_view> options) {
  for (std::string_view option : options) {
    if (s == option) return true;
  }
  return false;
}

// Go's strconv.ParseInt/ParseUint with base 0 (what go-yaml uses): optional sign, then
// 0x/0o/0b prefixes or a leading 0 for octal.
std::optional<json> ParseGoInteger(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return std::nullopt;
  int base = 10;
  if (s.size() > 1 && s[0] == '0') {
    char p = s[1];
    if (p == 'x' || p == 'X') {
      base = 16, s.remove_prefix(2);
    } else if (p == 'o' || p == 'O') {
      base = 8, s.remove_prefix(2);
    } else if (p == 'b' || p == 'B') {
      base = 2, s.remove_prefix(2);
    } else {
      base = 8, s.remove_prefix(1);
    }
  }
  if (s.empty()) return std::nullopt;
  unsigned __int128 magnitude = 0;
  for (char c : s) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    if (digit >= base) return std::nullopt;
    magnitude = magnitude * base + digit;
    if (magnitude > std::numeric_limits<uint64_t>::max()) return std::nullopt;
  }
  if (negative) {
    if (magnitude > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()) + 1) {
      return std::nullopt;
    }
    return json(static_cast<int64_t>(-static_cast<__int128>(magnitude)));
  }
  if (magnitude <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return json(static_cast<int64_t>(magnitude));
  }
  return json(static_cast<uint64_t>(magnitude));
}

// YAML 1.1 float syntax as go-yaml accepts it: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool LooksLikeFloat(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - start;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  } else {
    if (digits() == 0) return false;
    if (i < s.size() && s[i] == '.') {
      ++i;
      digits();
    }
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// nullopt: the scalar is a number JSON cannot hold (.inf, .nan).
std::optional<json> ResolvePlainScalar(const std::string& text) {
  if (IsOneOf(text, {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})) {
    return json(true);
  }
  if (IsOneOf(text, {"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})) {
    return json(false);
  }
  if (IsOneOf(text, {"", "~", "null", "Null", "NULL"})) return json(nullptr);
  if (IsOneOf(text, {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF",
                     ".nan", ".NaN", ".NAN"})) {
    return std::nullopt;
  }
  std::string plain;
  for (char c : text) {
    if (c != '_') plain += c;
  }
  if (auto integer = ParseGoInteger(plain)) return integer;
  if (LooksLikeFloat(plain)) {
    errno = 0;
    double value = std::strtod(plain.c_str(), nullptr);
    if (errno == ERANGE && std::isinf(value)) return std::nullopt;
    return json(value);
  }
  return json(text);
}

class Converter {
 public:
  Converter(const std::string& source, SourceMap* positions)
      : source_(source), positions_(positions) {}

  Status Convert(const YAML::Node& node, const FieldPath& path, SourcePosition position,
                 std::optional<SourcePosition> key_position, json* out) {
    if (++values_ > kMaxValues) {
      return Error(position, "the document has more than " + std::to_string(kMaxValues) +
                                 " values (recursive aliases?)");
    }
    positions_->Add(path, position, key_position);
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        *out = nullptr;
        return Status::Ok();
      case YAML::NodeType::Scalar:
        return ConvertScalar(node, path, position, out);
      case YAML::NodeType::Sequence: {
        *out = json::array();
        size_t index = 0;
        for (const YAML::Node& item : node) {
          json value;
          SP_RETURN_IF_ERROR(Convert(item, path.Index(index), ChildPosition(item, position),
                                     std::nullopt, &value));
          out->push_back(std::move(value));
          ++index;
        }
        return Status::Ok();
      }
      case YAML::NodeType::Map: {
        *out = json::object();
        for (const auto& entry : node) {
          const YAML::Node& key = entry.first;
          SourcePosition key_at = ToPosition(key.Mark());
          if (key.Mark().is_null()) key_at = position;
          if (!key.IsScalar()) {
            return Error(key_at, Prefix(path) +
                                     "mapping keys must be plain strings, not lists, maps or null");
          }
          const std::string& name = key.Scalar();
          FieldPath child = path / name;
          if (out->contains(name)) {
            return Error(key_at, child.Dotted() + ": duplicate key; each field may appear once");
          }
          // An empty value ("key:" then a newline) is marked at the start of the next line;
          // the key is where the user wrote it.
          SourcePosition value_at = ChildPosition(entry.second, key_at);
          if (entry.second.IsNull() && value_at.line != key_at.line) value_at = key_at;
          json value;
          SP_RETURN_IF_ERROR(Convert(entry.second, child, value_at, key_at, &value));
          (*out)[name] = std::move(value);
        }
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

 private:
  Status Error(SourcePosition at, const std::string& message) const {
    return InvalidArgument(source_ + ":" + std::to_string(at.line) + ":" +
                           std::to_string(at.column) + ": " + message);
  }

  static SourcePosition ChildPosition(const YAML::Node& node, SourcePosition fallback) {
    return node.Mark().is_null() ? fallback : ToPosition(node.Mark());
  }

  static std::string Prefix(const FieldPath& path) {
    return path.empty() ? "" : path.Dotted() + ": ";
  }

  Status ConvertScalar(const YAML::Node& node, const FieldPath& path, SourcePosition position,
                       json* out) {
    const std::string& tag = node.Tag();
    // "!" marks quoted and block scalars; an explicit !!str means the same.
    if (tag == "!" || tag == "tag:yaml.org,2002:str") {
      *out = node.Scalar();
      return Status::Ok();
    }
    std::optional<json> value = ResolvePlainScalar(node.Scalar());
    if (!value) {
      return Error(position, Prefix(path) + "\"" + node.Scalar() +
                                 "\" is a number JSON cannot represent (infinite or NaN); "
                                 "quote it if you mean a string");
    }
    *out = std::move(*value);
    return Status::Ok();
  }

  const std::string& source_;
  SourceMap* positions_;
  size_t values_ = 0;
};

}  // namespace

void SourceMap::Add(const FieldPath& path, SourcePosition value,
                    std::optional<SourcePosition> key) {
  entries_[path.Pointer()] = Entry{value, key};
}

SourcePosition SourceMap::Locate(const FieldPath& path, bool at_key) const {
  for (FieldPath p = path;; p = p.Parent()) {
    auto it = entries_.find(p.Pointer());
    if (it != entries_.end()) {
      const Entry& entry = it->second;
      bool want_key = at_key || !(p == path);
      return want_key && entry.key ? *entry.key : entry.value;
    }
    if (p.empty()) return {};
  }
}

namespace {

// Where each document of a stream starts, and whether one started where the one before it
// did. yaml-cpp 0.7 (Debian 12's) yields empty documents forever, without consuming
// anything, once it meets a token no document can start with (`"",` or a stray `,` after a
// document: jbeder/yaml-cpp#1040, fixed upstream by #1319), so LoadAll never returns and
// eats memory. Two documents never start at the same place in a stream that parses.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (started_ && mark.pos == last_.pos) stuck_ = true;
    started_ = true;
    last_ = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  bool stuck() const { return stuck_; }
  const YAML::Mark& last() const { return last_; }

 private:
  bool started_ = false;
  bool stuck_ = false;
  YAML::Mark last_;
};

}  // namespace

StatusOr<std::vector<YamlDocument>> ParseYamlStream(std::string_view text,
                                                    const std::string& source) {
  std::vector<YAML::Node> nodes;
  try {
    // The events first, to refuse a stream LoadAll would never finish (DocumentStarts).
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    DocumentStarts starts;
    while (parser.HandleNextDocument(starts)) {
      if (starts.stuck()) {
        SourcePosition at = ToPosition(starts.last());
        return InvalidArgument(source + ":" + std::to_string(at.line) + ":" +
                               std::to_string(at.column) +
                               ": invalid YAML: no document can start here");
      }
    }
    nodes = YAML::LoadAll(std::string(text));
  } catch (const YAML::Exception& e) {
    SourcePosition at = ToPosition(e.mark);
    return InvalidArgument(source + ":" + std::to_string(at.line) + ":" +
                           std::to_string(at.column) + ": invalid YAML: " + e.msg);
  }
  std::vector<YamlDocument> documents;
  documents.reserve(nodes.size());
  for (const YAML::Node& node : nodes) {
    YamlDocument document;
    document.number = static_cast<int>(documents.size()) + 1;
    Converter converter(source, &document.positions);
    SourcePosition start = node.Mark().is_null() ? SourcePosition{} : ToPosition(node.Mark());
    SP_RETURN_IF_ERROR(converter.Convert(node, FieldPath(), start, std::nullopt, &document.value));
    documents.push_back(std::move(document));
  }
  return documents;
}

}  // namespace spawnpoint::api
