#include "common/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return fail_errno("open", path.native());
  return read_fd(f.fd, path.native());
}

Status write_file_atomic(const std::filesystem::path& path, std::string_view content,
                         Durability durability) {
  mode_t mode = 0644;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) mode = st.st_mode & 07777;

  std::string tmp = path.native() + ".gpufence-XXXXXX";
  Fd f{::mkstemp(tmp.data())};
  if (f.fd < 0) return fail_errno("create temp file for", path.native());
  auto cleanup_fail = [&](std::string_view op) {
    auto err = fail_errno(op, tmp);
    ::unlink(tmp.c_str());
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
  if (::rename(tmp.c_str(), path.c_str()) != 0) return cleanup_fail("rename");
  if (durability == Durability::fsync) {
    Fd dir{::open(path.parent_path().empty() ? "." : path.parent_path().c_str(),
                  O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (dir.fd >= 0) ::fsync(dir.fd);
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

}  // namespace gpufence
