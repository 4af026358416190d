#include "common/file.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "common/fd.hpp"

namespace gpufence {

Result<std::string> read_fd(int fd, std::string_view origin, size_t max_bytes) {
  std::string out;
  char buf[16384];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno("read", origin);
    }
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes)
      return fail(Errc::invalid_argument, origin, " is larger than ", std::to_string(max_bytes),
                  " bytes");
  }
}

Result<std::string> read_file(const std::filesystem::path& path) {
  // O_NONBLOCK: a lease a container's root put on a file it can open (fsuid 0 owns it, so no
  // CAP_LEASE is needed) would otherwise hold this open for lease-break-time (45 s); a FIFO
  // would hold it forever. Neither changes how a regular file reads.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)};
  if (f.fd < 0) return fail_errno("open", path.native());
  return read_fd(f.fd, path.native());
}

Result<std::string> read_regular_file(const std::filesystem::path& path, size_t max_bytes) {
  // Looked at before it is opened for reading: opening a device node runs its driver's open.
  Fd held{::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC)};
  if (held.fd < 0) return fail_errno("open", path.native());
  struct stat st {};
  if (::fstat(held.fd, &st) != 0) return fail_errno("stat", path.native());
  if (!S_ISREG(st.st_mode))
    return fail(Errc::invalid_argument, path.native(), " is not a regular file");
  std::string self = "/proc/self/fd/" + std::to_string(held.fd);
  Fd f{::open(self.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)};
  if (f.fd < 0) return fail_errno("open", path.native());
  return read_fd(f.fd, path.native(), max_bytes);
}

std::string temp_name_for(std::string_view target_name, unsigned attempt) {
  return cat(".", target_name, ".gpufence-", ::getpid(), "-", attempt);
}

Result<TempFile> create_temp_for(int dir_fd, std::string_view target_name,
                                 std::string_view dir_path) {
  // Another writer of the same target in this process, or a pid reused after a killed run, may
  // hold a name: the next attempt is tried, never the taken one opened.
  constexpr unsigned kAttempts = 100;
  for (unsigned attempt = 0; attempt < kAttempts; ++attempt) {
    std::string name = temp_name_for(target_name, attempt);
    Fd f{
        ::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)};
    if (f.fd >= 0) return TempFile{std::move(f), std::move(name)};
    if (int err = errno; err != EEXIST)
      return fail_errno("create temp file", cat(dir_path, "/", name), err);
  }
  return fail(Errc::io, "create temp file for ", dir_path, "/", target_name, ": ", kAttempts,
              " names taken");
}

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "<pid>-<attempt>" (temp_name_for) or, from the hook of earlier releases, "<pid>" alone.
bool is_gpufence_temp_suffix(std::string_view s) {
  auto dash = s.find('-');
  if (dash == std::string_view::npos) return all_digits(s);
  return all_digits(s.substr(0, dash)) && all_digits(s.substr(dash + 1));
}

}  // namespace

std::optional<std::string_view> temp_target_name(std::string_view candidate) {
  if (!candidate.starts_with('.')) return std::nullopt;
  const std::string_view rest = candidate.substr(1);
  struct Shape {
    std::string_view marker;
    bool (*suffix)(std::string_view);
  };
  // The digits after the last marker cannot hold another marker, so the last one splits a temp
  // name for a target that itself contains ".gpufence-" or ".tmp-" correctly.
  static constexpr Shape kShapes[] = {
      {".gpufence-", is_gpufence_temp_suffix},
      {".tmp-", all_digits},  // install's link swap before temp_name_for existed
  };
  for (const auto& shape : kShapes) {
    auto at = rest.rfind(shape.marker);
    if (at == std::string_view::npos || at == 0) continue;
    const std::string_view target = rest.substr(0, at);
    if (target == "." || target == "..") continue;
    if (shape.suffix(rest.substr(at + shape.marker.size()))) return target;
  }
  return std::nullopt;
}

bool is_temp_name_for(std::string_view candidate, std::string_view target_name) {
  auto target = temp_target_name(candidate);
  return target && *target == target_name;
}

namespace {
Result<Fd> open_parent_dir(const std::filesystem::path& dir, Symlinks symlinks, MakeDir make_dir);
}  // namespace

Status write_file_atomic(const std::filesystem::path& path, std::string_view content,
                         Durability durability, Symlinks symlinks, MakeDir make_dir) {
  // Everything happens in the directory as it was opened once: the temp file is created there
  // O_EXCL|O_NOFOLLOW and renamed over the name there, so a link planted at the name, or at the
  // directory's name in between, decides nothing; rename replaces a link, never follows it.
  const std::filesystem::path parent = path.parent_path().empty() ? "." : path.parent_path();
  const std::string name = path.filename().native();
  if (name.empty() || name == "." || name == "..")
    return fail(Errc::invalid_argument, "not a file name: ", path.native());
  auto opened = open_parent_dir(parent, symlinks, make_dir);
  if (!opened) return std::unexpected(opened.error());
  const Fd& dir = *opened;
  mode_t mode = 0644;  // an existing regular file keeps its mode; a link's target's is not read
  struct stat st {};
  if (::fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
    mode = st.st_mode & 0777;  // never a set-id bit from whatever was planted there

  auto created = create_temp_for(dir.fd, name, parent.native());
  if (!created) return std::unexpected(created.error());
  const Fd f = std::move(created->fd);
  const std::string tmp = std::move(created->name);
  const std::string tmp_path = (parent / tmp).native();
  auto cleanup_fail = [&](std::string_view op) {
    auto err = fail_errno(op, tmp_path);
    ::unlinkat(dir.fd, tmp.c_str(), 0);
    return err;
  };
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(f.fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return cleanup_fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(f.fd, mode) != 0) return cleanup_fail("chmod");
  if (durability == Durability::fsync && ::fsync(f.fd) != 0) return cleanup_fail("fsync");
  if (::renameat(dir.fd, tmp.c_str(), dir.fd, name.c_str()) != 0) return cleanup_fail("rename");
  if (durability == Durability::fsync) {
    // fsync needs a real descriptor, not O_PATH: reopened through the one held.
    Fd sync_dir{::openat(dir.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (sync_dir.fd >= 0) ::fsync(sync_dir.fd);
  }
  return {};
}

Result<std::filesystem::path> write_target_through_links(const std::filesystem::path& path,
                                                         const std::filesystem::path& root) {
  std::filesystem::path current = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(current.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return current;
    std::error_code ec;
    std::filesystem::path target = std::filesystem::read_symlink(current, ec);
    if (ec) return fail(Errc::io, "readlink ", current.native(), ": ", ec.message());
    if (target.is_absolute()) {
      current = root.native() == "/" ? target : root / target.relative_path();
    } else {
      current = current.parent_path() / target;
    }
  }
  return fail(Errc::io, path.native(), ": more than 40 symbolic links");
}

Result<std::filesystem::path> write_backup_exclusive(const std::filesystem::path& path,
                                                     std::string_view content,
                                                     std::string_view stamp) {
  mode_t mode = 0600;  // a config may hold registry credentials: keep the original's mode
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) mode = st.st_mode & 0777;
  const std::string base = path.native() + ".bak-" + std::string(stamp);
  for (int n = 0; n < 1000; ++n) {
    std::string name = n == 0 ? base : base + "." + std::to_string(n);
    Fd f{::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)};
    if (f.fd < 0) {
      if (errno == EEXIST) continue;
      return fail_errno("create backup", name);
    }
    size_t done = 0;
    while (done < content.size()) {
      ssize_t w = ::write(f.fd, content.data() + done, content.size() - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        auto err = fail_errno("write backup", name);
        ::unlink(name.c_str());
        return err;
      }
      done += static_cast<size_t>(w);
    }
    if (::fchmod(f.fd, mode) != 0 || ::fsync(f.fd) != 0) {
      auto err = fail_errno("fsync backup", name);
      ::unlink(name.c_str());
      return err;
    }
    return std::filesystem::path(name);
  }
  return fail(Errc::io, base, ": 1000 backups with this time stamp already exist");
}

namespace {

// openat2 without following any symlink (and no /proc magic link) in any component.
int open_no_symlinks(int dirfd, const char* path, int flags, mode_t mode) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  int fd;
  do {
    fd = static_cast<int>(::syscall(SYS_openat2, dirfd, path, &how, sizeof how));
  } while (fd < 0 && errno == EAGAIN);
  return fd;
}

std::string what_is_there(const struct stat& st) {
  switch (st.st_mode & S_IFMT) {
    case S_IFLNK:
      return "a symbolic link";
    case S_IFIFO:
      return "a FIFO";
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a regular file";
  }
}

Result<Fd> open_parent_dir(const std::filesystem::path& dir, Symlinks symlinks, MakeDir make_dir) {
  const char* name = dir.empty() ? "." : dir.c_str();
  auto open_dir = [&] {
    return symlinks == Symlinks::none ? open_no_symlinks(AT_FDCWD, name, O_PATH | O_DIRECTORY, 0)
                                      : ::open(name, O_PATH | O_DIRECTORY | O_CLOEXEC);
  };
  Fd d{open_dir()};
  if (d.fd >= 0 || errno != ENOENT || make_dir == MakeDir::no) {
    if (d.fd < 0)
      return fail_errno(errno == ELOOP ? "open (a component is a symbolic link)" : "open directory",
                        dir.native());
    return d;
  }
  // Only the last directory is made, inside a parent opened the same way.
  auto grand = open_parent_dir(dir.parent_path(), symlinks, MakeDir::no);
  if (!grand) return std::unexpected(grand.error());
  std::string last = dir.filename().native();
  if (last.empty() || last == "." || last == "..")
    return fail(Errc::invalid_argument, "cannot make directory ", dir.native());
  if (::mkdirat(grand->fd, last.c_str(), 0700) != 0 && errno != EEXIST)
    return fail_errno("mkdir", dir.native());
  Fd again{open_dir()};
  if (again.fd < 0) return fail_errno("open directory", dir.native());
  return again;
}

}  // namespace

Result<Fd> open_append_checked(const std::filesystem::path& path, Symlinks symlinks, mode_t mode,
                               MakeDir make_dir) {
  const std::string name = path.filename().native();
  if (name.empty() || name == "." || name == "..")
    return fail(Errc::invalid_argument, "not a file name: ", path.native());
  auto dir = open_parent_dir(path.parent_path(), symlinks, make_dir);
  if (!dir) return std::unexpected(dir.error());

  // 1. A new file: made by us, so it is ours and regular.
  Fd made{::openat(dir->fd, name.c_str(),
                   O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC,
                   mode)};
  if (made.fd >= 0) return made;
  if (errno != EEXIST) return fail_errno("create", path.native());

  // 2. An existing one: look at it without opening it for I/O (a FIFO would block, a device act).
  Fd held{::openat(dir->fd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC)};
  if (held.fd < 0) return fail_errno("open", path.native());
  struct stat st {};
  if (::fstat(held.fd, &st) != 0) return fail_errno("stat", path.native());
  if (!S_ISREG(st.st_mode))
    return fail(Errc::denied, path.native(), " is ", what_is_there(st), ": not written");
  if (st.st_nlink != 1)
    return fail(Errc::denied, path.native(), " has ", st.st_nlink,
                " hard links (another name reaches the same file): not written");
  if (st.st_uid != ::geteuid())
    return fail(Errc::denied, path.native(), " is owned by uid ", st.st_uid,
                ", not by this process's user: not written");

  // 3. The same inode, reopened for append through the descriptor that was checked.
  std::string self = "/proc/self/fd/" + std::to_string(held.fd);
  // O_NONBLOCK: a lease taken by whoever else can open the file fails this at once instead of
  // holding the create for lease-break-time.
  Fd out{::open(self.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)};
  if (out.fd < 0) return fail_errno("reopen", path.native());
  struct stat again {};
  if (::fstat(out.fd, &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino)
    return fail(Errc::denied, path.native(), " changed while it was opened: not written");
  return out;
}

}  // namespace gpufence
