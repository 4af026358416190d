// Files inside a container's root, opened from the host as root. Everything in that tree is the
// container's: a symlink can point anywhere, an absolute one would resolve against the host's
// "/", and a FIFO or device where a file was expected would block or act. So every path is
// resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) on a descriptor of the root, as
// crun's safe_openat does (docs/trust-model.md, "Files a pod controls").
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace gpufence {

// An O_PATH descriptor of the directory `root` (a rootfs, or /proc/<pid>/root of a container).
Result<Fd> open_root_dir(const std::filesystem::path& root);

// A descriptor for `path` resolved inside `root_fd` as if root_fd were "/" (symlinks, "..",
// absolute links all stay inside; magic links refused). Always O_CLOEXEC.
Result<int> open_in_root(int root_fd, const std::string& path, int flags, unsigned mode = 0);

// The content of the regular file `path` inside the root, at most `max_bytes` (more is an error).
// Opened O_NONBLOCK|O_NOCTTY and checked with fstat before the first read: a FIFO, a device or a
// directory there is an error, never waited on.
Result<std::string> read_regular_in_root(int root_fd, const std::string& path,
                                         size_t max_bytes = size_t{1} << 20);

// Entry names of the directory `dir` inside the root, sorted, without "." and "..".
Result<std::vector<std::string>> list_in_root(int root_fd, const std::string& dir);

// An O_PATH descriptor of `path` inside the root only if it is a character device with this
// major:minor (no link followed out of the root; the node itself, not what a name points at).
std::optional<Fd> char_device_in_root(int root_fd, const std::string& path, unsigned major,
                                      unsigned minor);

}  // namespace gpufence
