#include "tests/apiserver/selectors.h"

#include <algorithm>
#include <cctype>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// Tokens of a label selector: words (keys and values), operators and punctuation.
class Lexer {
 public:
  explicit Lexer(const std::string& s) : s_(s) {}

  bool AtEnd() {
    SkipSpace();
    return i_ >= s_.size();
  }
  bool Consume(const std::string& tok) {
    SkipSpace();
    if (s_.compare(i_, tok.size(), tok) == 0) {
      i_ += tok.size();
      return true;
    }
    return false;
  }
  // A key or value: everything up to whitespace or an operator character.
  std::string Word() {
    SkipSpace();
    size_t start = i_;
    while (i_ < s_.size() && !IsSpace(s_[i_]) &&
           std::string("=!,()").find(s_[i_]) == std::string::npos) {
      ++i_;
    }
    return s_.substr(start, i_ - start);
  }
  // True (and consumed) if the next word is exactly `kw` followed by a space or '(', so a
  // key such as "input" is never mistaken for the `in` operator.
  bool Keyword(const std::string& kw) {
    SkipSpace();
    if (s_.compare(i_, kw.size(), kw) != 0) return false;
    size_t after = i_ + kw.size();
    if (after < s_.size() && !IsSpace(s_[after]) && s_[after] != '(') return false;
    i_ = after;
    return true;
  }

 private:
  void SkipSpace() {
    while (i_ < s_.size() && IsSpace(s_[i_])) ++i_;
  }
  const std::string& s_;
  size_t i_ = 0;
};

ApiError LabelParseError(const std::string& why) {
  return BadRequestError("unable to parse requirement: " + why);
}

bool ValidLabelKey(const std::string& k) {
  if (k.empty() || k.size() > 317) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '/')) {
      return false;
    }
  }
  return true;
}

std::string LabelValue(const nlohmann::json& labels, const std::string& key, bool* present) {
  *present = false;
  if (!labels.is_object()) return "";
  auto it = labels.find(key);
  if (it == labels.end() || !it->is_string()) return "";
  *present = true;
  return it->get<std::string>();
}

}  // namespace

LabelSelector LabelSelector::Parse(const std::string& text) {
  LabelSelector sel;
  Lexer lx(text);
  if (lx.AtEnd()) return sel;
  while (true) {
    Requirement r;
    if (lx.Consume("!")) {
      r.key = lx.Word();
      r.op = Op::kDoesNotExist;
    } else {
      r.key = lx.Word();
      bool set_op = false;
      if (lx.Consume("==") || lx.Consume("=")) {
        r.op = Op::kEquals;
        r.values.push_back(lx.Word());
      } else if (lx.Consume("!=")) {
        r.op = Op::kNotEquals;
        r.values.push_back(lx.Word());
      } else if (lx.Keyword("notin")) {
        r.op = Op::kNotIn;
        set_op = true;
      } else if (lx.Keyword("in")) {
        r.op = Op::kIn;
        set_op = true;
      } else {
        r.op = Op::kExists;
      }
      if (set_op) {
        if (!lx.Consume("(")) {
          throw LabelParseError("found unexpected token in selector \"" + text +
                                "\", expected: '('");
        }
        while (true) {
          std::string v = lx.Word();
          if (!v.empty()) r.values.push_back(v);
          if (lx.Consume(")")) break;
          if (!lx.Consume(",")) {
            throw LabelParseError("found unexpected token in selector \"" + text +
                                  "\", expected: ',' or ')'");
          }
        }
        if (r.values.empty()) {
          throw LabelParseError("for 'in', 'notin' operators, values set can't be empty");
        }
      }
    }
    if (!ValidLabelKey(r.key)) {
      throw LabelParseError("invalid label key \"" + r.key + "\" in selector \"" + text + "\"");
    }
    sel.reqs_.push_back(std::move(r));
    if (lx.AtEnd()) break;
    if (!lx.Consume(",")) {
      throw LabelParseError("found unexpected token in selector \"" + text + "\", expected: ','");
    }
  }
  return sel;
}

LabelSelector LabelSelector::FromJson(const nlohmann::json& selector) {
  LabelSelector sel;
  if (!selector.is_object()) return sel;
  if (selector.contains("matchLabels") && selector["matchLabels"].is_object()) {
    for (auto& [k, v] : selector["matchLabels"].items()) {
      sel.reqs_.push_back({k, Op::kEquals, {v.is_string() ? v.get<std::string>() : v.dump()}});
    }
  }
  if (selector.contains("matchExpressions") && selector["matchExpressions"].is_array()) {
    for (const auto& e : selector["matchExpressions"]) {
      Requirement r;
      r.key = e.value("key", "");
      std::string op = e.value("operator", "");
      if (op == "In")
        r.op = Op::kIn;
      else if (op == "NotIn")
        r.op = Op::kNotIn;
      else if (op == "Exists")
        r.op = Op::kExists;
      else if (op == "DoesNotExist")
        r.op = Op::kDoesNotExist;
      else
        throw BadRequestError("\"" + op + "\" is not a valid label selector operator");
      if (e.contains("values") && e["values"].is_array()) {
        for (const auto& v : e["values"]) r.values.push_back(v.get<std::string>());
      }
      sel.reqs_.push_back(std::move(r));
    }
  }
  return sel;
}

bool LabelSelector::Matches(const nlohmann::json& labels) const {
  for (const auto& r : reqs_) {
    bool present = false;
    std::string v = LabelValue(labels, r.key, &present);
    bool in_values = std::find(r.values.begin(), r.values.end(), v) != r.values.end();
    switch (r.op) {
      case Op::kEquals:
      case Op::kIn:
        if (!present || !in_values) return false;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        // The real server treats a missing label as satisfying != and notin.
        if (present && in_values) return false;
        break;
      case Op::kExists:
        if (!present) return false;
        break;
      case Op::kDoesNotExist:
        if (present) return false;
        break;
    }
  }
  return true;
}

FieldSelector FieldSelector::Parse(const std::string& text,
                                   const std::vector<std::string>& supported) {
  FieldSelector sel;
  size_t i = 0;
  while (i < text.size()) {
    size_t comma = text.find(',', i);
    if (comma == std::string::npos) comma = text.size();
    std::string term = text.substr(i, comma - i);
    i = comma + 1;
    if (term.find_first_not_of(" \t") == std::string::npos) continue;
    Requirement r;
    size_t pos;
    if ((pos = term.find("!=")) != std::string::npos) {
      r.field = term.substr(0, pos);
      r.equals = false;
      r.value = term.substr(pos + 2);
    } else if ((pos = term.find("==")) != std::string::npos) {
      r.field = term.substr(0, pos);
      r.equals = true;
      r.value = term.substr(pos + 2);
    } else if ((pos = term.find('=')) != std::string::npos) {
      r.field = term.substr(0, pos);
      r.equals = true;
      r.value = term.substr(pos + 1);
    } else {
      throw BadRequestError("invalid selector: '" + text + "'; can't understand '" + term + "'");
    }
    auto trim = [](std::string s) {
      size_t b = s.find_first_not_of(" \t");
      size_t e = s.find_last_not_of(" \t");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    r.field = trim(r.field);
    r.value = trim(r.value);
    if (!supported.empty() &&
        std::find(supported.begin(), supported.end(), r.field) == supported.end()) {
      throw BadRequestError("field label not supported: " + r.field);
    }
    sel.reqs_.push_back(std::move(r));
  }
  return sel;
}

bool FieldSelector::Matches(const nlohmann::json& object) const {
  for (const auto& r : reqs_) {
    bool eq = FieldValue(object, r.field) == r.value;
    if (eq != r.equals) return false;
  }
  return true;
}

std::string FieldSelector::Pinned(const std::string& field) const {
  for (const auto& r : reqs_) {
    if (r.field == field && r.equals) return r.value;
  }
  return "";
}

std::string FieldValue(const nlohmann::json& object, const std::string& dotted_path) {
  const nlohmann::json* cur = &object;
  size_t i = 0;
  while (i <= dotted_path.size()) {
    size_t dot = dotted_path.find('.', i);
    if (dot == std::string::npos) dot = dotted_path.size();
    std::string part = dotted_path.substr(i, dot - i);
    if (!cur->is_object()) return "";
    auto it = cur->find(part);
    if (it == cur->end()) return "";
    cur = &*it;
    i = dot + 1;
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_null() || cur->is_object() || cur->is_array()) return "";
  return cur->dump();
}

}  // namespace spawnpoint::kubetest
