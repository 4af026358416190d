// Plain file access by absolute path. Host paths go through HostFs instead; this is for files the
// caller names directly (a bundle's config.json, a config file given on the command line).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace gpufence {

// Reads a whole file with read(2) in a loop, so /proc and /sys files (st_size 0) work too.
Result<std::string> read_file(const std::filesystem::path& path);

// Reads `path` only if its last component is a regular file (O_NOFOLLOW|O_NONBLOCK, checked with
// fstat before the first read): a link, FIFO or device planted at a name root reads is an error,
// never followed or waited on.
Result<std::string> read_regular_file(const std::filesystem::path& path,
                                      size_t max_bytes = size_t{16} << 20);

// Reads `fd` to its end (`origin` names it in errors); more than `max_bytes` is an error.
Result<std::string> read_fd(int fd, std::string_view origin,
                            size_t max_bytes = static_cast<size_t>(-1));

// How much of a path may be a symbolic link when root opens it to write.
enum class Symlinks {
  none,            // no component at all (openat2 RESOLVE_NO_SYMLINKS): paths of gpufence's own
  in_parent_only,  // the last component never (O_NOFOLLOW); the parent as the caller named it
};

// Whether a missing last directory of the path is made (0700, owned by the caller).
enum class MakeDir { yes, no };

enum class Durability { fsync, none };

// The one rule for the temporary file a writer fills before renaming it over `target_name`:
// beside the target (rename(2) is atomic only within one file system, and in the directory the
// writer already holds), hidden, and named after it: ".<target_name>.gpufence-<pid>-<attempt>".
// Every writer of gpufence's (write_file_atomic, the hooks' in-root write, the binary link swap)
// takes its names from here, and whoever cleans up after a killed run recognises them with
// is_temp_name_for, so one rule decides both.
std::string temp_name_for(std::string_view target_name, unsigned attempt);

// Creates a temp file for `target_name` in the directory `dir_fd` (O_EXCL|O_NOFOLLOW, 0600, so
// nothing planted at a temp name is ever opened or followed), trying further attempts while the
// name is taken. `dir_path` names the directory in errors.
struct TempFile {
  Fd fd;
  std::string name;  // inside the directory
};
Result<TempFile> create_temp_for(int dir_fd, std::string_view target_name,
                                 std::string_view dir_path);

// The target whose temp file `candidate` (a directory entry's name) is, or nullopt when it is no
// temp file of gpufence's. Besides temp_name_for's shape, it knows the shapes earlier releases
// left on nodes that already run gpufence, so their leftovers are still cleaned up:
// ".<name>.tmp-<pid>" (install's link swap) and ".<name>.gpufence-<pid>" (the update-ldcache
// hook). Only exactly these: a name that merely contains ".tmp" or ".gpufence-" is not one.
std::optional<std::string_view> temp_target_name(std::string_view candidate);

// Whether `candidate` is a temp file of gpufence's for `target_name` (and no other target).
bool is_temp_name_for(std::string_view candidate, std::string_view target_name);

// Replaces `path` atomically: writes a temp file beside it (temp_name_for), fsyncs, renames over,
// fsyncs the directory. Keeps the old file's mode. On any failure the old content is untouched. The
// directory is opened as `symlinks` says (and its last component made 0700 when `make_dir`).
Status write_file_atomic(const std::filesystem::path& path, std::string_view content,
                         Durability durability = Durability::fsync,
                         Symlinks symlinks = Symlinks::in_parent_only,
                         MakeDir make_dir = MakeDir::no);

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

// Opens `path` for appending as root without letting whoever can write its directory decide
// where the bytes land: resolved as `symlinks` says; a missing file is created `mode` with
// O_EXCL|O_NOFOLLOW; an existing one is first opened O_PATH (no open of a FIFO or device ever
// happens) and taken only when it is a regular file with one link, owned by this process's
// user, then reopened for append through that descriptor. Anything else is an error naming
// what was there, and nothing is written (docs/trust-model.md, "Where root writes").
Result<Fd> open_append_checked(const std::filesystem::path& path, Symlinks symlinks, mode_t mode,
                               MakeDir make_dir = MakeDir::no);

}  // namespace gpufence
