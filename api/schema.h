// Internal to api/: checks a JSON value against a structural OpenAPI v3 schema the way the
// Kubernetes API server checks a custom resource with kubectl's strict field validation, for
// the subset of schema keywords that Kubernetes' own types use in a CRD (what
// scripts/gen-pod-template-schema.py emits): type, properties, additionalProperties, items,
// required, x-kubernetes-preserve-unknown-fields, x-kubernetes-int-or-string, the Quantity
// pattern, and the keys of x-kubernetes-list-type map and set lists. Other keywords (format,
// which the API server does not enforce either) are ignored. Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include "api/field_path.h"
#include "api/field_reader.h"
#include "common/status.h"

namespace spawnpoint::api {

// The schema of TrainingJob's spec.template: Kubernetes' PodTemplateSpec at the pinned
// release, as in crds/trainingjob.yaml. Generated into api/pod_template_schema.json and
// compiled into the library (api/CMakeLists.txt); parsed on first use.
const nlohmann::json& PodTemplateSchema();

// Checks `value`, found at `path`, against `schema`, and returns the first problem through
// reader->Fail (so YAML callers can turn its path into a line and column): an unknown field
// (at its key, with "did you mean" and the allowed fields), a value of the wrong type, a
// required field missing, a malformed quantity, a duplicate key in a map or set list. A null
// value is an omitted field, as the API server prunes nulls of non-nullable fields.
Status CheckSchema(const nlohmann::json& value, const FieldPath& path, const nlohmann::json& schema,
                   FieldReader* reader);

// A Kubernetes quantity as the API server's pattern accepts it: "2", "500m", "1.5Gi", "1e3".
bool IsQuantity(std::string_view text);

}  // namespace spawnpoint::api
