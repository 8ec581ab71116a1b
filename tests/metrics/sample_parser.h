// Reads the samples of a text-format (0.0.4) exposition back for assertions: every
// non-comment line "name{labels} value" becomes series["name{labels}"] = value, with the
// label text kept exactly as written. Pure functions; thread-safe.
#pragma once

#include <map>
#include <string>

namespace spawnpoint::testing {

std::map<std::string, double> ParseSamples(const std::string& text);

// The series of `name` whose label text contains every one of `needles` (e.g. `rank="0"`);
// the first found, or NaN when none.
double FindSample(const std::map<std::string, double>& samples, const std::string& name,
                  std::initializer_list<std::string> needles = {});

}  // namespace spawnpoint::testing
