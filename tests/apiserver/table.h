// Server-side printing: the `meta.k8s.io/v1 Table` that kubectl asks for with
// `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`. Custom resources get Name plus
// their CRD's additionalPrinterColumns (simple JSONPath, `date` columns rendered as an age
// like the real server); built-ins get the columns kubectl users expect for pods,
// namespaces and nodes, and Name/Age otherwise. Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apiserver/resources.h"

namespace spawnpoint::kubetest {

enum class IncludeObject { kNone, kMetadata, kObject };

// `objects` are full objects; `with_columns` false leaves columnDefinitions empty (the real
// server omits them from all watch events after the first).
json BuildTable(const ResourceInfo& info, const std::vector<json>& objects, IncludeObject include,
                bool with_columns, const std::string& resource_version,
                const std::string& continue_token = "");

// Evaluates a simple JSONPath (`.a.b`, `.a[0].b`, `.a['x.y']`, `.a[*].b`, `{...}` braces
// allowed) and returns the matched values (empty when nothing matches).
std::vector<json> EvalJsonPath(const json& object, const std::string& path);

// k8s.io/apimachinery's duration.HumanDuration: "45s", "5m3s", "3h", "2d5h", ...
std::string HumanDuration(std::chrono::seconds d);
// Age of an RFC 3339 timestamp relative to now, or "<unknown>".
std::string AgeOf(const std::string& timestamp);

// RFC 3339 (UTC, seconds) for a wall-clock time, and back (false when malformed).
std::string FormatTimestamp(std::chrono::system_clock::time_point t);
bool ParseTimestamp(const std::string& s, std::chrono::system_clock::time_point* out);

}  // namespace spawnpoint::kubetest
