// Parsers for what the doctor reads off a node, each a pure function over the text, tested on
// literal /proc and /sys content (malformed included).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "doctor/snapshot.hpp"

namespace gpufence {

// The container id in /proc/<pid>/cgroup, in every containerd/CRI form:
//   cgroupfs v1  "4:devices:/kubepods/besteffort/pod<uid>/<64 hex>"
//   systemd      "0::/kubepods.slice/.../cri-containerd-<64 hex>.scope"
//   plain        "0::/default/<64 hex>" (ctr), "/system.slice/containerd.service/..." is not one.
std::optional<std::string> container_id_from_cgroup(std::string_view proc_cgroup);

// The cgroup path of `controller` ("devices" on v1); "" for the v2 unified line ("0::/...").
std::optional<std::string> cgroup_path(std::string_view proc_cgroup, std::string_view controller);

// NUL-separated /proc/<pid>/environ; a truncated last entry is kept if it has '='.
std::map<std::string, std::string> parse_environ(std::string_view environ);

// CapBnd from /proc/<pid>/status, as a bit mask.
std::optional<unsigned long long> bounding_caps(std::string_view status);
// A capability set line of /proc/<pid>/status ("CapEff", "CapBnd", "CapPrm"), as a bit mask.
std::optional<unsigned long long> status_caps(std::string_view status, std::string_view field);
// Capability numbers (include/uapi/linux/capability.h).
inline constexpr int kCapSysPtrace = 19;
inline constexpr int kCapSysAdmin = 21;

// A sysfs mount a process can write through: /proc/<pid>/mountinfo lines whose filesystem type is
// "sysfs" and whose per-mount options (field 6) say "rw" (Documentation/filesystems/proc.rst,
// "/proc/<pid>/mountinfo"). A hostPath of /sys or below shows up as such a line (its root, field
// 4, is the part of sysfs bound there); runc mounts a container's own /sys read-only unless it is
// privileged. Each entry is "MOUNT_POINT (sysfs ROOT)".
std::vector<std::string> writable_sysfs_mounts(std::string_view mountinfo);

// v1 devices.list: which major-195 minors can be opened (r or w), or nullopt when the list
// starts with allow-all ("a *:* rwm"), where v1 hides later denies and only a probe can tell.
std::optional<std::set<unsigned>> openable_gpu_minors_from_devices_list(
    std::string_view list, const std::set<unsigned>& gpu_minors);

// The OCI spec's devices cgroup rules replayed for each GPU minor (allow-all then denies, or
// default-deny then allows), as runc applies them.
std::set<unsigned> openable_gpu_minors_from_oci_rules(std::string_view config_json,
                                                      const std::set<unsigned>& gpu_minors);

// DeepStream configs (deepstream-app and nvinfer, INI-like): every "gpu-id=N" with its section.
struct GpuIdKey {
  std::string section;
  int gpu_id = 0;
  int line = 0;
};
std::vector<GpuIdKey> deepstream_gpu_ids(std::string_view config);

// The kubelet's device checkpoint (kubernetes pkg/kubelet/cm/devicemanager/checkpoint,
// kubelet_internal_checkpoint: Data.PodDeviceEntries[] with PodUID, ContainerName, ResourceName,
// DeviceIDs by NUMA node and AllocResp, the marshalled ContainerAllocateResponse in base64): the
// entries of `resource`. An error for text that is not such a checkpoint.
Result<std::vector<CheckpointAllocation>> parse_kubelet_checkpoint(std::string_view text,
                                                                   std::string_view resource);

}  // namespace gpufence
