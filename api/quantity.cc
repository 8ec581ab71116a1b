// ParseQuantity: Kubernetes resource quantities (resource.Quantity syntax) as bytes.

#include <cctype>
#include <cstdint>
#include <limits>
#include <string>

#include "api/training_job.h"

namespace spawnpoint::api {
namespace {

using u128 = unsigned __int128;

constexpr const char* kQuantityHelp =
    "expected a non-negative number with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei (powers of "
    "1024) or k, M, G, T, P, E (powers of 1000), e.g. \"8Gi\"";

// Enough for any int64 byte count written with a generous fraction.
constexpr size_t kMaxDigits = 36;

Status Invalid(std::string_view text, const std::string& why) {
  return InvalidArgument("invalid quantity \"" + std::string(text) + "\": " + why);
}

// The suffix a user most likely meant by "GB", "gi", "KiB", "K", ...: nullopt if no guess.
std::optional<std::string> GuessSuffix(std::string_view number, std::string_view suffix) {
  std::string s(suffix);
  if (!s.empty() && (s.back() == 'B' || s.back() == 'b')) s.pop_back();
  if (!s.empty() && (s.back() == 'i' || s.back() == 'I')) s.pop_back();
  if (s.size() != 1) return std::nullopt;
  char letter = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  if (std::string_view("KMGTPE").find(letter) == std::string_view::npos) return std::nullopt;
  std::string n(number);
  std::string decimal(1, letter == 'K' ? 'k' : letter);
  return "\"" + n + letter + "i\" (powers of 1024) or \"" + n + decimal + "\" (powers of 1000)";
}

bool MultiplyChecked(u128* value, u128 factor) {
  if (factor != 0 && *value > std::numeric_limits<u128>::max() / factor) return false;
  *value *= factor;
  return true;
}

u128 Pow(u128 base, int exponent) {
  u128 out = 1;
  for (int i = 0; i < exponent; ++i) out *= base;
  return out;
}

}  // namespace

StatusOr<int64_t> ParseQuantity(std::string_view text) {
  if (text.empty()) return Invalid(text, std::string("empty; ") + kQuantityHelp);
  size_t i = 0;
  if (text[0] == '+' || text[0] == '-') {
    if (text[0] == '-') return Invalid(text, "must not be negative");
    ++i;
  }
  std::string int_digits, frac_digits;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    int_digits += text[i++];
  }
  bool has_point = i < text.size() && text[i] == '.';
  if (has_point) {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      frac_digits += text[i++];
    }
  }
  if (int_digits.empty() && frac_digits.empty()) {
    return Invalid(text, std::string("must start with a number; ") + kQuantityHelp);
  }
  std::string_view number = text.substr(0, i);
  std::string_view suffix = text.substr(i);

  // value = mantissa * 2^binary_exponent * 10^decimal_exponent
  int binary_exponent = 0;
  int decimal_exponent = 0;
  static constexpr std::string_view kDecimal = "kMGTPE";
  if (suffix.empty()) {
  } else if (suffix.size() == 1 && kDecimal.find(suffix[0]) != std::string_view::npos) {
    decimal_exponent = 3 * (static_cast<int>(kDecimal.find(suffix[0])) + 1);
  } else if (suffix.size() == 2 && suffix[1] == 'i' &&
             std::string_view("KMGTPE").find(suffix[0]) != std::string_view::npos) {
    binary_exponent = 10 * (static_cast<int>(std::string_view("KMGTPE").find(suffix[0])) + 1);
  } else if ((suffix[0] == 'e' || suffix[0] == 'E') && suffix.size() > 1) {
    // Decimal exponent form ("1e9", "5E-3"); a bare "E" is the exa suffix above.
    size_t j = 1;
    bool negative = false;
    if (suffix[j] == '+' || suffix[j] == '-') negative = suffix[j++] == '-';
    if (j == suffix.size()) return Invalid(text, "the exponent has no digits");
    int exponent = 0;
    for (; j < suffix.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(suffix[j]))) {
        return Invalid(text, "unknown suffix \"" + std::string(suffix) + "\"; " + kQuantityHelp);
      }
      exponent = exponent * 10 + (suffix[j] - '0');
      if (exponent > 100) return Invalid(text, "exponent out of range");
    }
    decimal_exponent = negative ? -exponent : exponent;
  } else if (suffix == "m" || suffix == "u" || suffix == "n") {
    return Invalid(text, "\"" + std::string(suffix) +
                             "\" is a fraction (milli, micro, nano), not a size in bytes; did you "
                             "mean " +
                             GuessSuffix(number, "M").value_or("") + "?");
  } else {
    std::string why = "unknown suffix \"" + std::string(suffix) + "\"";
    if (auto guess = GuessSuffix(number, suffix)) why += " (did you mean " + *guess + "?)";
    return Invalid(text, why + "; " + kQuantityHelp);
  }

  std::string digits = int_digits + frac_digits;
  decimal_exponent -= static_cast<int>(frac_digits.size());
  size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return int64_t{0};
  digits = digits.substr(first);
  while (digits.size() > 1 && digits.back() == '0') {
    digits.pop_back();
    ++decimal_exponent;
  }
  Status too_large = Invalid(text, "too large; the maximum is " +
                                       std::to_string(std::numeric_limits<int64_t>::max()) +
                                       " bytes (just under 8Ei)");
  if (digits.size() > kMaxDigits) return too_large;
  u128 value = 0;
  for (char c : digits) value = value * 10 + static_cast<u128>(c - '0');
  if (!MultiplyChecked(&value, Pow(2, binary_exponent))) return too_large;
  if (decimal_exponent >= 0) {
    if (decimal_exponent > 38 || !MultiplyChecked(&value, Pow(10, decimal_exponent))) {
      return too_large;
    }
  } else if (-decimal_exponent > 38) {
    value = 1;  // a positive fraction of a byte; Kubernetes rounds up
  } else {
    u128 divisor = Pow(10, -decimal_exponent);
    value = (value + divisor - 1) / divisor;
  }
  if (value > static_cast<u128>(std::numeric_limits<int64_t>::max())) return too_large;
  return static_cast<int64_t>(value);
}

}  // namespace spawnpoint::api
