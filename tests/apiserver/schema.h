// Structural-schema handling for custom resources, in the order the real API server applies
// it to a request body: prune fields the schema does not declare (recording them, for
// fieldValidation=Strict/Warn), apply `default` values, then validate (type, required, enum,
// minimum/maximum and their exclusive forms, pattern, minLength/maxLength, items,
// minItems/maxItems, properties, additionalProperties, min/maxProperties, nullable,
// x-kubernetes-preserve-unknown-fields, x-kubernetes-int-or-string,
// x-kubernetes-embedded-resource, allOf/anyOf/oneOf/not). Error wording follows
// kube-openapi and apiextensions-apiserver so clients see the real messages.
// Pure functions over JSON values; thread-safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apiserver/api_error.h"

namespace spawnpoint::kubetest {

// Removes every field `schema` does not allow and appends its path ("spec.foo",
// "spec.items[0].bar") to `unknown` (which may be null). At the root, apiVersion, kind and
// metadata are always kept; unknown metadata fields are pruned like the real ObjectMeta
// decoding does.
void PruneUnknownFields(json& object, const json& schema, std::vector<std::string>* unknown);

// Fills in missing fields that have a `default` (recursively), replaces nulls of fields
// that are not nullable with their default, and drops such nulls when there is none.
void ApplyDefaults(json& object, const json& schema);

// Validates `object` against `schema`; an empty result means valid. Paths are rooted at the
// object ("spec.nodes"); the root's metadata is not checked here.
std::vector<FieldError> ValidateAgainstSchema(const json& object, const json& schema);

}  // namespace spawnpoint::kubetest
