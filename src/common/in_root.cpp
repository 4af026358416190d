#include "common/in_root.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>

#include "common/file.hpp"

namespace gpufence {

Result<Fd> open_root_dir(const std::filesystem::path& root) {
  int fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail_errno("open container root", root.native());
  return Fd(fd);
}

Result<int> open_in_root(int root_fd, const std::string& path, int flags, unsigned mode) {
  struct open_how how {};
  how.flags = static_cast<__u64>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  std::string rel = path.empty() ? "." : path;
  int fd;
  do {
    fd = static_cast<int>(::syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof how));
  } while (fd < 0 && errno == EAGAIN);
  if (fd < 0) return fail_errno("open (inside the container root)", path);
  return fd;
}

Result<std::string> read_regular_in_root(int root_fd, const std::string& path, size_t max_bytes) {
  auto opened = open_in_root(root_fd, path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (!opened) return std::unexpected(opened.error());
  Fd f(*opened);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fail_errno("stat (inside the container root)", path);
  if (!S_ISREG(st.st_mode))
    return fail(Errc::invalid_argument, path, " (inside the container root) is not a regular file");
  return read_fd(f.fd, path + " (inside the container root)", max_bytes);
}

Result<std::vector<std::string>> list_in_root(int root_fd, const std::string& dir) {
  auto opened = open_in_root(root_fd, dir, O_RDONLY | O_DIRECTORY);
  if (!opened) return std::unexpected(opened.error());
  DIR* d = ::fdopendir(*opened);
  if (!d) {
    ::close(*opened);
    return fail_errno("opendir (inside the container root)", dir);
  }
  std::vector<std::string> names;
  while (auto* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<Fd> char_device_in_root(int root_fd, const std::string& path, unsigned major,
                                      unsigned minor) {
  auto opened = open_in_root(root_fd, path, O_PATH | O_NOFOLLOW);
  if (!opened) return std::nullopt;
  Fd f(*opened);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISCHR(st.st_mode) || ::major(st.st_rdev) != major ||
      ::minor(st.st_rdev) != minor)
    return std::nullopt;
  return f;
}

}  // namespace gpufence
