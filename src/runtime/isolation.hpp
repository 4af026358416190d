// The edit at the heart of the shim: make a spec give exactly the granted GPUs.
//
// Facts it relies on (measured with runc 1.1.5 on cgroup v1, field-notes-runtime.md):
// - a deny rule after an allow-all blocks the device (even though v1 devices.list still shows
//   only "a *:* rwm");
// - a deny that punches a hole in a wildcard allow such as "c *:* m" makes runc refuse to start,
//   so in a default-deny spec we remove allows instead of adding denies;
// - a node listed in linux.devices without an allow rule opens with EPERM.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

inline constexpr unsigned kNvidiaMajor = 195;

struct DeviceNode {
  std::string path;  // path in the container, same as on the host: "/dev/nvidia1"
  unsigned major = 0;
  unsigned minor = 0;
};

struct IsolationPlan {
  std::vector<DeviceNode> grant;   // granted GPU nodes, then the control nodes present
  std::set<unsigned> deny_minors;  // major-195 minors of every GPU not granted
  std::vector<std::string> uuids;  // granted GPUs, for NVIDIA_/CUDA_VISIBLE_DEVICES
  bool explicit_none = false;      // the request said "none"
};

struct IsolationResult {
  bool changed = false;
  std::vector<std::string> removed_nodes;  // GPU nodes taken out of linux.devices
  std::vector<unsigned> denied_minors;     // deny rules added (allow-all specs)
  size_t removed_rules = 0;                // allow rules removed (default-deny specs)
};

// Edits `spec` in place. Fails (leaving the caller to discard the copy) when a rule admits
// unallocated GPUs in a way that cannot be narrowed, e.g. "c *:* rw" in a default-deny spec.
Result<IsolationResult> isolate_spec(Json& spec, const IsolationPlan& plan);

// "/dev/nvidia12" -> 12; nullopt for /dev/nvidiactl, /dev/nvidia-uvm, ...
std::optional<unsigned> gpu_node_minor(std::string_view path);

}  // namespace gpufence
