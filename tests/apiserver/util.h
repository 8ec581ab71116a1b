// Small helpers shared inside the test server (and its test client): lower-casing, boolean
// query parameters as Go reads them, tolerant reads of JSON fields, and base64. Internal
// to tests/apiserver/; pure functions.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spawnpoint::kubetest {

// ASCII lower case.
inline std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Whether a boolean parameter is true as Go's strconv.ParseBool reads it ("1", "t", "T",
// "TRUE", "true", "True"); anything else, including what ParseBool refuses, is false.
inline bool TrueParam(const std::string& v) {
  return v == "1" || v == "t" || v == "T" || v == "TRUE" || v == "true" || v == "True";
}

// obj[key] when obj is an object holding a string there; "" otherwise.
inline std::string Str(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

// The strings of the array obj[key] (other elements skipped); empty when there is none.
inline std::vector<std::string> Strings(const nlohmann::json& obj, const char* key) {
  std::vector<std::string> out;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

// Standard base64 with padding; with `url` the URL alphabet ('-', '_') and no padding, as
// in a JWT.
std::string Base64Encode(const std::string& in, bool url = false);
// Either alphabet; stops at the first '='. False on any other character.
bool Base64Decode(const std::string& in, std::string* out);

}  // namespace spawnpoint::kubetest
