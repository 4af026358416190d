// Bind mounts that would hand an unprivileged container its own devices cgroup. On cgroup v1 a
// process needs only euid 0 (no capability) to move itself into another cgroup by writing
// cgroup.procs, so a hostPath volume of /sys/fs/cgroup (or of anything that contains it, bound
// recursively, as containerd's CRI binds volumes) lets a container join the root devices cgroup
// and open every GPU. A read-only bind does not help: runc applies "ro" to the top mount of an
// rbind only. docs/trust-model.md
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

// One line of /proc/<pid>/mountinfo (proc(5)), octal escapes undone.
struct MountInfoEntry {
  std::string root;         // the path inside the filesystem that is mounted
  std::string mount_point;  // where, relative to the reader's root
  std::string options;      // per-mount options ("ro,nosuid,...")
  std::string fstype;
  bool is_cgroupfs() const { return fstype == "cgroup" || fstype == "cgroup2"; }
  bool read_only() const;
};
std::vector<MountInfoEntry> parse_mountinfo(std::string_view mountinfo);

// Mount points of every cgroup and cgroup2 filesystem in /proc/self/mountinfo text.
std::vector<std::string> cgroup_mount_points(std::string_view mountinfo);

// A bind mount that receives mounts from the host (slave or shared propagation: the kubelet's
// HostToContainer and Bidirectional) would show a cgroup filesystem mounted on the host after the
// cgroup-mounts hook judged the table, so it is refused; a bind without a propagation option
// (runc then leaves it a slave of the host, as it makes "/" rslave) gets "rprivate", which is
// what containerd's CRI writes for mountPropagation: None. Returns whether the spec changed.
Result<bool> pin_private_propagation(Json& spec);

// Whether any mount of the spec could put a cgroup filesystem into the container (a bind, whose
// source is a path someone may swap, or a cgroup mount of its own). runc's default mounts (proc,
// tmpfs, sysfs, devpts, mqueue) and the runtime's cgroup mount cannot.
bool may_mount_a_cgroupfs(const Json& spec);

// Whether the container has a cgroup namespace of its own (spec linux.namespaces "cgroup").
enum class CgroupNamespace { own, host };

// What was mounted, judged after the fact: the mount table of the container (read by our
// createContainer hook, in its mount namespace, after runc made every mount and before
// pivot_root) may hold a cgroup filesystem only as the runtime's own: at <rootfs>/sys/fs/cgroup
// or one hierarchy right below it, read-only, rooted at the container's own cgroup. Anything
// else (a hostPath volume swapped to /sys/fs/cgroup after the path check, a CDI mount, a
// symlinked destination) refuses the create. `rootfs` is the real path of the container's root.
Status check_container_cgroup_mounts(std::string_view mountinfo, const std::string& rootfs,
                                     CgroupNamespace cgroupns);

// Refuses a bind mount whose source is inside a cgroup filesystem, or (recursive binds) holds one
// below it. `resolve` turns a source into the host path it names (symlinks resolved).
Status refuse_cgroupfs_binds(const Json& spec, const std::vector<std::string>& cgroup_mounts,
                             const std::function<std::string(const std::string&)>& resolve);

}  // namespace gpufence
