// Small helpers for reading sysfs-style files; internal to spawnpoint_devices. Pure
// functions over the file system, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spawnpoint::devices::internal {

// The file's contents without surrounding whitespace; nullopt if it cannot be read.
std::optional<std::string> ReadTrimmed(const std::string& path);
// A decimal or 0x-prefixed integer file; nullopt if missing or not a number.
std::optional<int64_t> ReadInt(const std::string& path);
// Entry names of a directory, sorted; empty if it does not exist.
std::vector<std::string> ListDir(const std::string& path);
bool Exists(const std::string& path);
// NUMA node of a PCI device from <sysfs_root>/bus/pci/devices/<bus_id>/numa_node; -1 if
// unknown (the kernel itself writes -1 on machines without NUMA).
int PciNumaNode(const std::string& sysfs_root, const std::string& pci_bus_id);

}  // namespace spawnpoint::devices::internal
