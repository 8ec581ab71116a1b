// The version spawnpoint's binaries report (`spawnpoint-agent --version`,
// `spawnpoint-operator --version`). scripts/images.sh tags the images with it and refuses to
// build when it is not charts/spawnpoint/Chart.yaml's appVersion. Constant; thread-safe.
#pragma once

namespace spawnpoint {

inline constexpr char kVersion[] = "0.1.0";

}  // namespace spawnpoint
