// Plain file access by absolute path. Host paths go through HostFs instead; this is for files the
// caller names directly (a bundle's config.json, a config file given on the command line).
#pragma once

#include <filesystem>
#include <string>

#include "common/error.hpp"

namespace gpufence {

// Reads a whole file with read(2) in a loop, so /proc and /sys files (st_size 0) work too.
Result<std::string> read_file(const std::filesystem::path& path);

// Reads `fd` to its end (`origin` names it in errors); more than `max_bytes` is an error.
Result<std::string> read_fd(int fd, std::string_view origin,
                            size_t max_bytes = static_cast<size_t>(-1));

enum class Durability { fsync, none };

// Replaces `path` atomically: writes a temp file beside it, fsyncs, renames over, fsyncs the
// directory. Keeps the old file's mode. On any failure the old content is untouched.
Status write_file_atomic(const std::filesystem::path& path, std::string_view content,
                         Durability durability = Durability::fsync);

// Where a write meant for `path` must land so that a symlink stays a symlink: follows links in
// the last component (at most 40), an absolute target taken under `root` (--host-root). Returns
// `path` itself when it is not a link or does not exist.
Result<std::filesystem::path> write_target_through_links(const std::filesystem::path& path,
                                                         const std::filesystem::path& root = "/");

// Keeps `content` in a new file "<path>.bak-<stamp>" (".1", ".2", ... appended when taken),
// created with O_CREAT|O_EXCL so no existing file, earlier backup or planted link is ever
// replaced or followed; written and fsynced before it returns the name.
Result<std::filesystem::path> write_backup_exclusive(const std::filesystem::path& path,
                                                     std::string_view content,
                                                     std::string_view stamp);

}  // namespace gpufence
