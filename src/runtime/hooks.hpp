// The OCI hooks gpufence-runtime adds and then runs as `gpufence-runtime hook <name> ...`.
// createContainer hooks run as host root in the container's mount namespace, after its mounts and
// before pivot_root, with cwd = the container's rootfs and the container's state JSON on stdin
// (runc and crun; docs/trust-model.md). So every path a hook touches is resolved *inside* the
// container's root with openat2(RESOLVE_IN_ROOT) (common/in_root.hpp), as crun's safe_openat
// does: an image's symlinks can point anywhere, and following one from here would write to the
// host.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "runtime/mount_guard.hpp"

namespace gpufence {

// What a hook needs of its container, from its OCI state (stdin) and the bundle's config.json.
struct HookContainer {
  std::filesystem::path rootfs;  // absolute: bundle + root.path
  CgroupNamespace cgroupns = CgroupNamespace::host;
};
Result<HookContainer> container_from_state(std::string_view state_json);

// The createContainer hook `cgroup-mounts`: check_container_cgroup_mounts over the hook's own
// mount table (the container's), so what runc actually mounted is judged, not a path read before.
Status check_cgroup_mounts(const HookContainer& container,
                           const std::string& mountinfo_path = "/proc/self/mountinfo");

// Covers <rootfs>/<dir> with a read-only tmpfs and binds back only the entries named in `keep`
// (e.g. /proc/driver/nvidia/gpus keeping "0000:01:00.0"). A missing dir is not an error.
Status narrow_directory(const std::filesystem::path& rootfs, const std::string& dir,
                        const std::vector<std::string>& keep);

// How long ldconfig may run: well inside the hook's own limit (kDefaultHookTimeoutSeconds, 30 s),
// so a stuck ldconfig is killed and reported by the hook, which lets the container start, rather
// than runc killing the hook and failing the create.
inline constexpr std::chrono::milliseconds kLdconfigTimeout = std::chrono::seconds(8);

// Lists `folders` in <rootfs>/etc/ld.so.conf.d/00-gpufence-cdi.conf (created inside the root,
// never through a link out of it) and runs the host's ldconfig by absolute path, chrooted to the
// container's root by its -r option, with a fixed environment, killed after `timeout`.
Status update_ldcache(const std::filesystem::path& rootfs, const std::vector<std::string>& folders,
                      const std::string& ldconfig = "",
                      std::chrono::milliseconds timeout = kLdconfigTimeout);

// `gpufence-runtime hook NAME ARGS...`: returns the exit code; the state is read from stdin.
int run_hook(const std::vector<std::string>& args);

}  // namespace gpufence
