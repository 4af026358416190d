// Facts about the host's device numbers that the spec edit needs, read through HostFs and parsed
// from literal text: which majors the kernel has registered (/proc/devices), which DRM nodes
// (/dev/dri/card*, renderD*) belong to which PCI device (/sys/class/drm), and the numbers of the
// char nodes a decision grants. docs/nvidia-devices.md
//
// One decision reads them once, into a HostDeviceFacts value, before anything is planned: the
// plan and the CDI edits are then pure functions of the spec and that value, so the same facts
// judge every step, and tests and the fuzzer hand the flow a table instead of a host.
#pragma once

#include <map>
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

// What one decision needs to know about the host's devices.
struct HostDeviceQuery {
  std::set<std::string> char_paths;  // host paths whose device numbers are read
  bool drm_nodes = false;            // whether /sys/class/drm is read
};

// The host's device facts for one decision. A fact the query did not ask for reads as absent, so
// a step that needs more than was read refuses rather than grants.
struct HostDeviceFacts {
  Result<ProcDevices> registered = fail(Errc::not_found, "/proc/devices was not read");
  std::vector<DrmNode> drm_nodes;
  std::map<std::string, Result<DeviceNode>> char_nodes;  // by host path; the node's path is it

  // The char device at `host_path`, as the node a container gets at `container_path`.
  Result<DeviceNode> char_device(const std::string& host_path,
                                 const std::string& container_path) const;
};

// Reads what `query` names through `host`: /proc/devices always, one lstat per char path,
// /sys/class/drm when asked.
HostDeviceFacts read_host_device_facts(const HostFs& host, const HostDeviceQuery& query);

}  // namespace gpufence
