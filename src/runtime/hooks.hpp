// The OCI hooks gpufence-runtime adds and then runs as `gpufence-runtime hook <name> ...`.
// createContainer hooks run in the container's mount namespace after its mounts and before
// pivot_root (runc; field-notes-runtime.md), with the container's state JSON on stdin. What a
// hook mounts there is invisible on the host.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

// The container's root filesystem (absolute) from its OCI state: bundle + config.json root.path.
Result<std::filesystem::path> rootfs_from_state(std::string_view state_json);

// Covers `dir` with a read-only tmpfs and binds back only the entries named in `keep`
// (e.g. /proc/driver/nvidia/gpus keeping "0000:01:00.0"). A missing `dir` is not an error.
Status narrow_directory(const std::filesystem::path& dir, const std::vector<std::string>& keep);

// Lists `folders` in <rootfs>/etc/ld.so.conf.d/00-gpufence-cdi.conf and runs the host's ldconfig
// on the container's root, so the libraries a CDI spec mounted are found by name.
Status update_ldcache(const std::filesystem::path& rootfs, const std::vector<std::string>& folders);

// `gpufence-runtime hook NAME ARGS...`: returns the exit code; the state is read from stdin.
int run_hook(const std::vector<std::string>& args);

}  // namespace gpufence
