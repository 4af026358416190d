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

// Mount points of every cgroup and cgroup2 filesystem in /proc/self/mountinfo text.
std::vector<std::string> cgroup_mount_points(std::string_view mountinfo);

// Refuses a bind mount whose source is inside a cgroup filesystem, or (recursive binds) holds one
// below it. `resolve` turns a source into the host path it names (symlinks resolved).
Status refuse_cgroupfs_binds(const Json& spec, const std::vector<std::string>& cgroup_mounts,
                             const std::function<std::string(const std::string&)>& resolve);

}  // namespace gpufence
