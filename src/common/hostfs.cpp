#include "common/hostfs.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>

#include "common/file.hpp"

namespace gpufence {

HostFs::HostFs(std::filesystem::path root) : m_root(std::move(root)) {
  if (m_root.empty()) m_root = "/";
}

std::filesystem::path HostFs::resolve(std::string_view host_path) const {
  while (!host_path.empty() && host_path.front() == '/') host_path.remove_prefix(1);
  if (host_path.empty()) return m_root;
  return m_root / std::filesystem::path(host_path);
}

Result<std::string> HostFs::read(std::string_view host_path) const {
  return read_file(resolve(host_path));
}

bool HostFs::exists(std::string_view host_path) const {
  struct stat st {};
  return ::lstat(resolve(host_path).c_str(), &st) == 0;
}

Result<FileInfo> HostFs::stat(std::string_view host_path) const {
  auto path = resolve(host_path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return fail_errno("stat", path.native());
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

Result<std::vector<std::string>> HostFs::list(std::string_view host_path) const {
  auto path = resolve(host_path);
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return fail_errno("opendir", path.native());
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
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  if (n < 0) return fail_errno("readlink", path.native());
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace gpufence
