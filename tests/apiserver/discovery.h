// Discovery and OpenAPI documents generated from the Registry:
//   /version, /api, /api/v1, /apis, /apis/<g>, /apis/<g>/<v>  (legacy discovery)
//   /api and /apis as apidiscovery.k8s.io/v2 APIGroupDiscoveryList (aggregated discovery,
//   what kubectl 1.32 asks for first)
//   /openapi/v3 and /openapi/v3/<api|apis/g>/<v>  (what `kubectl explain` reads, and what
//   kubectl's field-validation check looks for: a PATCH operation per kind that lists the
//   `fieldValidation` query parameter)
//   /openapi/v2 as JSON (kubectl asks for protobuf and falls back when it cannot have it).
// Custom resources get their CRD schema (with ObjectMeta by reference and the
// x-kubernetes-group-version-kind extension); built-ins get a minimal object schema.
// Pure functions of the registry snapshot passed in; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/apiserver/resources.h"

namespace spawnpoint::kubetest {

json VersionDocument();
json CoreApiVersions(const std::string& server_address);
json ApiGroupList(const Registry& registry);
std::optional<json> ApiGroup(const Registry& registry, const std::string& group);
// null when the group/version is not served.
std::optional<json> ApiResourceList(const Registry& registry, const std::string& group,
                                    const std::string& version);
// Aggregated discovery: `core` true for /api, false for /apis.
json AggregatedDiscovery(const Registry& registry, bool core);

json OpenApiV3Root(const Registry& registry);
// `gv_path` is "api/v1" or "apis/<group>/<version>".
std::optional<json> OpenApiV3GroupVersion(const Registry& registry, const std::string& gv_path);
json OpenApiV2(const Registry& registry);

}  // namespace spawnpoint::kubetest
