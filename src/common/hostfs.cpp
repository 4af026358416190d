#include "common/hostfs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>

#include "common/file.hpp"
#include "common/in_root.hpp"

namespace gpufence {

HostFs::HostFs(std::filesystem::path root) : m_root(std::move(root)) {
  if (m_root.empty()) m_root = "/";
}

std::filesystem::path HostFs::resolve(std::string_view host_path) const {
  while (!host_path.empty() && host_path.front() == '/') host_path.remove_prefix(1);
  if (host_path.empty()) return m_root;
  return m_root / std::filesystem::path(host_path);
}

// Under a root other than "/", a path is resolved inside it (common/in_root.hpp): the host's
// absolute links (Debian's /var/run -> /run, a config linked to /etc/alternatives/...) then name
// the host's files under the root, not this process's. At "/" it is a plain open.
Result<Fd> HostFs::open(std::string_view host_path, int flags) const {
  auto path = resolve(host_path);
  if (m_root == "/") {
    int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) return fail_errno("open", path.native());
    return Fd(fd);
  }
  auto root = open_root_dir(m_root);
  if (!root) return std::unexpected(root.error());
  auto fd = open_in_root(root->fd, std::string(host_path), flags);
  if (!fd) return fail(fd.error().code, "open ", path.native(), ": ", fd.error().message);
  return Fd(*fd);
}

Result<HostFs::SocketPath> HostFs::socket_path(std::string_view host_path) const {
  std::filesystem::path p(host_path);
  if (!p.is_absolute() || !p.has_filename())
    return fail(Errc::invalid_argument, "socket path '", std::string(host_path),
                "' is not an absolute file path");
  auto dir = open(p.parent_path().string(), O_PATH | O_DIRECTORY);
  if (!dir) return std::unexpected(dir.error());
  auto held = std::make_shared<Fd>(std::move(*dir));
  return SocketPath{held, cat("/proc/self/fd/", held->fd, "/", p.filename().string())};
}

// Only regular files (procfs and sysfs files are): a FIFO or a device where a file was expected
// would block the reader or act on open, so it is opened O_NONBLOCK|O_NOCTTY and refused after
// fstat (docs/trust-model.md, "Files a pod controls").
Result<std::string> HostFs::read_regular(std::string_view host_path, int extra_flags) const {
  auto f = open(host_path, O_RDONLY | O_NONBLOCK | O_NOCTTY | extra_flags);
  if (!f) return std::unexpected(f.error());
  struct stat st {};
  if (::fstat(f->fd, &st) != 0) return fail_errno("stat", resolve(host_path).native());
  if (!S_ISREG(st.st_mode))
    return fail(Errc::invalid_argument, resolve(host_path).native(), " is not a regular file");
  return read_fd(f->fd, resolve(host_path).native(), kMaxReadBytes);
}

Result<std::string> HostFs::read(std::string_view host_path) const {
  return read_regular(host_path, 0);
}

Result<std::string> HostFs::read_own(std::string_view host_path) const {
  return read_regular(host_path, O_NOFOLLOW);
}

bool HostFs::exists(std::string_view host_path) const {
  struct stat st {};
  if (m_root == "/") return ::lstat(resolve(host_path).c_str(), &st) == 0;
  return open(host_path, O_PATH | O_NOFOLLOW).has_value();
}

namespace {
FileInfo file_info(const struct stat& st);
}  // namespace

Result<FileInfo> HostFs::stat(std::string_view host_path) const {
  auto path = resolve(host_path);
  struct stat st {};
  if (m_root == "/") {
    if (::lstat(path.c_str(), &st) != 0) return fail_errno("stat", path.native());
  } else {
    auto f = open(host_path, O_PATH | O_NOFOLLOW);
    if (!f) return std::unexpected(f.error());
    if (::fstat(f->fd, &st) != 0) return fail_errno("stat", path.native());
  }
  return file_info(st);
}

Result<FileInfo> HostFs::stat_target(std::string_view host_path) const {
  auto path = resolve(host_path);
  struct stat st {};
  auto f = open(host_path, O_PATH);
  if (!f) return std::unexpected(f.error());
  if (::fstat(f->fd, &st) != 0) return fail_errno("stat", path.native());
  return file_info(st);
}

namespace {
FileInfo file_info(const struct stat& st) {
  FileInfo info;
  info.mode = st.st_mode & 07777;
  switch (st.st_mode & S_IFMT) {
    case S_IFREG:
      info.type = FileType::regular;
      break;
    case S_IFDIR:
      info.type = FileType::directory;
      break;
    case S_IFCHR:
      info.type = FileType::char_device;
      break;
    case S_IFBLK:
      info.type = FileType::block_device;
      break;
    case S_IFLNK:
      info.type = FileType::symlink;
      break;
    default:
      info.type = FileType::other;
  }
  if (info.type == FileType::char_device || info.type == FileType::block_device) {
    info.major = ::major(st.st_rdev);
    info.minor = ::minor(st.st_rdev);
  }
  return info;
}
}  // namespace

Result<std::vector<std::string>> HostFs::list(std::string_view host_path) const {
  auto path = resolve(host_path);
  auto f = open(host_path, O_RDONLY | O_DIRECTORY);
  if (!f) return std::unexpected(f.error());
  DIR* dir = ::fdopendir(f->fd);
  if (!dir) return fail_errno("opendir", path.native());
  f->fd = -1;  // the DIR owns it now
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    names.emplace_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::string> HostFs::read_link(std::string_view host_path) const {
  auto path = resolve(host_path);
  char buf[4096];
  ssize_t n;
  if (m_root == "/") {
    n = ::readlink(path.c_str(), buf, sizeof buf);
  } else {
    auto f = open(host_path, O_PATH | O_NOFOLLOW);
    if (!f) return std::unexpected(f.error());
    n = ::readlinkat(f->fd, "", buf, sizeof buf);
  }
  if (n < 0) return fail_errno("readlink", path.native());
  return std::string(buf, static_cast<size_t>(n));
}

Result<std::string> host_path_arg(const std::string& value, std::string_view flag,
                                  const std::filesystem::path& host_root) {
  if (value.empty() || std::filesystem::path(value).is_absolute()) return value;
  if (!host_root.empty() && host_root != "/")
    return fail(Errc::invalid_argument, flag, " ", value,
                " is relative: with --host-root, give the path on the host (absolute)");
  std::error_code ec;
  auto abs = std::filesystem::absolute(value, ec);
  if (ec) return fail(Errc::invalid_argument, flag, " ", value, ": ", ec.message());
  return abs.lexically_normal().string();
}

}  // namespace gpufence
