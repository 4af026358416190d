// The edit at the heart of the shim: make a spec give exactly the granted GPUs.
//
// Facts it relies on (docs/device-cgroup.md, measured with runc 1.1.5):
// - runc's systemd cgroup driver cannot express a blacklist ("allow all, then deny"): it turns one
//   into a deny-all placeholder that a later `systemctl daemon-reload` re-applies. So wherever a
//   spec admits devices by a wildcard major (a privileged container's "allow a *:* rwm"), the
//   rules are rewritten as a whitelist: deny all, then allow each registered major and each
//   granted node. Both cgroup drivers express that the same way.
// - a deny that punches a hole in a wildcard allow makes runc refuse to start, so denies are
//   never emitted after allows;
// - a node listed in linux.devices without an allow rule opens with EPERM.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

struct DeviceNode {
  std::string path;  // path in the container, same as on the host: "/dev/nvidia1"
  unsigned major = 0;
  unsigned minor = 0;
};

struct RegisteredMajors {
  std::vector<unsigned> character;  // from /proc/devices
  std::vector<unsigned> block;
};

using DeviceNumber = std::pair<unsigned, unsigned>;  // (major, minor) of a char device

struct IsolationPlan {
  std::vector<DeviceNode> grant;  // granted GPU nodes and their control nodes: added and allowed
  std::set<DeviceNumber> keep;    // reserved-major nodes the container may keep if it has them
                                  // (DRM nodes of other vendors' or of the granted GPUs)
  std::set<unsigned> reserved_majors = {kNvidiaMajor, kDrmMajor};  // never wildcard-allowed
  RegisteredMajors host_majors;    // needed only to rewrite a wildcard spec as a whitelist
  std::vector<std::string> uuids;  // granted GPUs, for NVIDIA_/CUDA_VISIBLE_DEVICES
  bool explicit_none = false;      // the request said "none"
};

struct IsolationResult {
  bool changed = false;
  bool whitelisted = false;                // wildcard rules rewritten as a whitelist
  std::vector<std::string> removed_nodes;  // nodes taken out of linux.devices
  size_t removed_rules = 0;                // allow rules dropped from a default-deny list
};

// Whether the spec's rules admit every device through a wildcard major ("allow a *:* rwm", what
// containerd writes for a privileged container); such a spec needs IsolationPlan::host_majors.
bool admits_all_devices(const Json& spec);

// Edits `spec` in place (the caller discards the copy on error).
Result<IsolationResult> isolate_spec(Json& spec, const IsolationPlan& plan);

// "/dev/nvidia12" -> 12; nullopt for /dev/nvidiactl, /dev/nvidia-uvm, ...
std::optional<unsigned> gpu_node_minor(std::string_view path);

}  // namespace gpufence
