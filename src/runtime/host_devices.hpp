// Facts about the host's device numbers that the spec edit needs, read through HostFs and parsed
// from literal text: which majors the kernel has registered (/proc/devices) and which DRM nodes
// (/dev/dri/card*, renderD*) belong to which PCI device (/sys/class/drm). docs/nvidia-devices.md
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "runtime/isolation.hpp"

namespace gpufence {

struct RegisteredMajor {
  unsigned major = 0;
  std::string name;  // "nvidia-frontend", "nvidia-uvm", "drm", ...
};

struct ProcDevices {
  std::vector<RegisteredMajor> character;
  std::vector<RegisteredMajor> block;
};

// /proc/devices: "Character devices:" and "Block devices:" sections of "<major> <name>" lines.
Result<ProcDevices> parse_proc_devices(std::string_view text);

// Char majors that are handed out node by node only, never by a wildcard rule: the GPUs' 195, DRM's
// 226, and every major the NVIDIA driver registered under a "nvidia" name (nvidia-uvm,
// nvidia-caps, nvidia-nvswitch, ...).
std::set<unsigned> nvidia_reserved_majors(const ProcDevices& devices);

struct DrmNode {
  std::string name;        // "card1", "renderD129"
  unsigned minor = 0;      // major is always 226
  std::string pci_bus_id;  // "0000:01:00.0", lower case; "" when not a PCI device
  bool nvidia = false;     // PCI vendor 0x10de
};

// Every DRM node /sys/class/drm describes. Missing sysfs gives an empty list.
std::vector<DrmNode> read_drm_nodes(const HostFs& host);

// The character device at `path` on the host, as a node the container gets at the same path.
Result<DeviceNode> host_char_device(const HostFs& host, const std::string& path);

}  // namespace gpufence
