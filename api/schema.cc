#include "api/schema.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace spawnpoint::api {

// Defined in the file api/CMakeLists.txt generates from api/pod_template_schema.json.
extern const char kPodTemplateSchemaJson[];

namespace {

using nlohmann::json;

// A value in a message: JSON, with bytes that are not UTF-8 (a manifest may carry them)
// shown as U+FFFD rather than thrown on.
std::string Show(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The pattern controller-gen gives a resource.Quantity; IsQuantity implements it.
constexpr std::string_view kQuantityPattern =
    R"(^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$)";

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// ([0-9]+(\.[0-9]*)?)|(\.[0-9]+) at text[*i], advancing *i.
bool ReadNumber(std::string_view text, size_t* i) {
  size_t start = *i;
  while (*i < text.size() && IsDigit(text[*i])) ++*i;
  bool integer_part = *i > start;
  if (*i < text.size() && text[*i] == '.') {
    ++*i;
    size_t fraction = *i;
    while (*i < text.size() && IsDigit(text[*i])) ++*i;
    return integer_part || *i > fraction;
  }
  return integer_part;
}

bool IsIntegral(const json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return true;
  // 2.0 is an integer to the API server too (YAML floats become JSON numbers).
  return v.is_number_float() && std::isfinite(v.get<double>()) &&
         v.get<double>() == std::trunc(v.get<double>());
}

std::vector<std::string_view> Keys(const json& properties) {
  std::vector<std::string_view> keys;
  for (auto it = properties.begin(); it != properties.end(); ++it) keys.push_back(it.key());
  return keys;
}

class Checker {
 public:
  explicit Checker(FieldReader* reader) : reader_(reader) {}

  Status Check(const json& value, const FieldPath& path, const json& schema) {
    if (value.is_null()) return Status::Ok();
    if (schema.value("x-kubernetes-int-or-string", false)) return IntOrString(value, path, schema);
    const std::string type = schema.value("type", "");
    if (type == "object") return Object(value, path, schema);
    if (type == "array") return Array(value, path, schema);
    if (type == "string" && !value.is_string()) return Wrong(value, path, "a string");
    if (type == "boolean" && !value.is_boolean()) {
      return Wrong(value, path, "a boolean (true or false)");
    }
    if (type == "number" && !value.is_number()) return Wrong(value, path, "a number");
    if (type == "integer" && !IsIntegral(value)) return Wrong(value, path, "an integer");
    return Status::Ok();
  }

 private:
  Status Wrong(const json& value, const FieldPath& path, const std::string& expected) {
    return reader_->WrongType({&value, path}, expected);
  }

  Status IntOrString(const json& value, const FieldPath& path, const json& schema) {
    const bool quantity = schema.value("pattern", "") == kQuantityPattern;
    if (!value.is_string() && !IsIntegral(value)) {
      // As the API server: a CRD's int-or-string takes no fractions (0.5 must be "500m").
      return Wrong(value, path,
                   quantity ? "an integer or a quantity string such as \"500m\" or \"4Gi\" "
                              "(quote a fraction: \"0.5\")"
                            : "an integer or a string");
    }
    if (quantity && value.is_string() && !IsQuantity(value.get<std::string>())) {
      return reader_->Fail(path, "must be a quantity such as \"2\", \"500m\" or \"4Gi\", got " +
                                     Quote(value.get<std::string>()));
    }
    return Status::Ok();
  }

  Status Object(const json& value, const FieldPath& path, const json& schema) {
    if (!value.is_object()) return Wrong(value, path, "an object");
    static const json kEmpty = json::object();
    auto props = schema.find("properties");
    const json& properties = props == schema.end() ? kEmpty : *props;
    auto additional = schema.find("additionalProperties");
    const bool preserve = schema.value("x-kubernetes-preserve-unknown-fields", false);
    for (auto it = value.begin(); it != value.end(); ++it) {
      FieldPath child = path / it.key();
      if (auto p = properties.find(it.key()); p != properties.end()) {
        SP_RETURN_IF_ERROR(Check(it.value(), child, *p));
      } else if (additional != schema.end() && additional->is_object()) {
        SP_RETURN_IF_ERROR(Check(it.value(), child, *additional));
      } else if (!preserve) {
        std::vector<std::string_view> allowed = Keys(properties);
        std::string hint;
        if (auto guess = Suggest(it.key(), allowed))
          hint = " (did you mean " + Quote(*guess) + "?)";
        return reader_->Fail(child, "unknown field" + hint + "; allowed: " + Join(allowed),
                             /*at_key=*/true);
      }
    }
    for (const json& name : schema.value("required", json::array())) {
      auto it = value.find(name.get<std::string>());
      if (it == value.end() || it->is_null()) {
        return reader_->Fail(path / name.get<std::string>(), "required");
      }
    }
    return Status::Ok();
  }

  Status Array(const json& value, const FieldPath& path, const json& schema) {
    auto items = schema.find("items");
    if (!value.is_array()) {
      bool strings = items != schema.end() && items->value("type", "") == "string";
      return Wrong(value, path, strings ? "a list of strings" : "a list");
    }
    for (size_t i = 0; items != schema.end() && i < value.size(); ++i) {
      SP_RETURN_IF_ERROR(Check(value[i], path.Index(i), *items));
    }
    return UniqueKeys(value, path, schema);
  }

  // A map list's entries differ in their keys (a set's in their values), as the API server
  // requires.
  Status UniqueKeys(const json& list, const FieldPath& path, const json& schema) {
    const std::string type = schema.value("x-kubernetes-list-type", "");
    if (type != "map" && type != "set") return Status::Ok();
    const json keys = schema.value("x-kubernetes-list-map-keys", json::array());
    std::vector<std::string> seen;
    for (size_t i = 0; i < list.size(); ++i) {
      json key = list[i];
      std::string shown;
      if (type == "map") {
        key = json::object();
        auto defaults = schema["items"].value("properties", json::object());
        for (const json& k : keys) {
          const std::string name = k.get<std::string>();
          json v = list[i].is_object() ? list[i].value(name, json()) : json();
          if (v.is_null()) v = defaults.value(name, json::object()).value("default", json());
          key[name] = v;
          shown += (shown.empty() ? "" : ", ") + name + " " + Show(v);
        }
      } else {
        shown = Show(key);
      }
      // Compared byte for byte: a manifest's strings need not be UTF-8, which dump() throws
      // on (and replacing would make two different strings one).
      const std::vector<std::uint8_t> cbor = json::to_cbor(key);
      std::string dumped(cbor.begin(), cbor.end());
      for (size_t j = 0; j < seen.size(); ++j) {
        if (seen[j] != dumped) continue;
        return reader_->Fail(path.Index(i), "duplicate entry (" + shown + ") also at index " +
                                                std::to_string(j) + "; each must be unique");
      }
      seen.push_back(std::move(dumped));
    }
    return Status::Ok();
  }

  FieldReader* const reader_;
};

}  // namespace

bool IsQuantity(std::string_view text) {
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  if (!ReadNumber(text, &i)) return false;
  std::string_view suffix = text.substr(i);
  if (suffix.empty()) return true;
  if (suffix.size() == 2 && suffix[1] == 'i' &&
      std::string_view("KMGTPE").find(suffix[0]) != std::string_view::npos) {
    return true;
  }
  if (suffix.size() == 1 &&
      std::string_view("numkMGTPE").find(suffix[0]) != std::string_view::npos) {
    return true;
  }
  if (suffix[0] != 'e' && suffix[0] != 'E') return false;
  size_t j = 1;
  if (j < suffix.size() && (suffix[j] == '+' || suffix[j] == '-')) ++j;
  return ReadNumber(suffix, &j) && j == suffix.size();
}

const json& PodTemplateSchema() {
  static const json* const schema = new json(json::parse(kPodTemplateSchemaJson));
  return *schema;
}

Status CheckSchema(const json& value, const FieldPath& path, const json& schema,
                   FieldReader* reader) {
  return Checker(reader).Check(value, path, schema);
}

}  // namespace spawnpoint::api
