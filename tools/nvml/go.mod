// NVIDIA's nvml.h, as the go-nvml module ships it (pkg/nvml/nvml.h): not a tool, a header.
// scripts/install-tools.sh fetches this version through the Go module proxy (go.sum pins its
// checksum) and copies the header to .tools/include/nvml.h, where the test nvml_header_abi
// (tests/devices/nvml_header_check.sh) checks agent/devices/nvml_abi.h and the fake NVML
// library against it. No Go code is built.
module spawnpoint.dev/tools/nvml

go 1.20

require github.com/NVIDIA/go-nvml v0.13.4-1
