// Plain file access by absolute path. Host paths go through HostFs instead; this is for files the
// caller names directly (a bundle's config.json, a config file given on the command line).
#pragma once

#include <filesystem>
#include <string>

#include "common/error.hpp"

namespace gpufence {

// Reads a whole file with read(2) in a loop, so /proc and /sys files (st_size 0) work too.
Result<std::string> read_file(const std::filesystem::path& path);

enum class Durability { fsync, none };

// Replaces `path` atomically: writes a temp file beside it, fsyncs, renames over, fsyncs the
// directory. Keeps the old file's mode. On any failure the old content is untouched.
Status write_file_atomic(const std::filesystem::path& path, std::string_view content,
                         Durability durability = Durability::fsync);

}  // namespace gpufence
