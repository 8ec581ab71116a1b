#include "tests/metrics/sample_parser.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace spawnpoint::testing {

std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // The value follows the last space; label values may contain spaces but never end
    // the line, since the value always does.
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    const std::string value = line.substr(sp + 1);
    double v = std::numeric_limits<double>::quiet_NaN();
    if (value == "+Inf") {
      v = std::numeric_limits<double>::infinity();
    } else if (value == "-Inf") {
      v = -std::numeric_limits<double>::infinity();
    } else if (value != "NaN") {
      v = std::stod(value);
    }
    out[line.substr(0, sp)] = v;
  }
  return out;
}

double FindSample(const std::map<std::string, double>& samples, const std::string& name,
                  std::initializer_list<std::string> needles) {
  for (const auto& [series, value] : samples) {
    if (series.compare(0, name.size(), name) != 0) continue;
    if (series.size() > name.size() && series[name.size()] != '{') continue;
    bool all = true;
    for (const auto& n : needles) all = all && series.find(n) != std::string::npos;
    if (all) return value;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace spawnpoint::testing
