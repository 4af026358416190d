// Every read of the host (/proc, /sys, /dev, /etc/...) goes through a HostFs rooted at
// --host-root (default "/"). That is what lets tests run on a fake tree and the doctor run from a
// pod with the host mounted at /host. Under a root other than "/", paths resolve inside it
// (openat2 RESOLVE_IN_ROOT): the host's absolute symlinks name the host's files.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct Fd;  // common/fd.hpp

enum class FileType { regular, directory, char_device, block_device, symlink, other };

struct FileInfo {
  FileType type = FileType::other;
  unsigned major = 0;  // of the device, for char/block devices
  unsigned minor = 0;
  unsigned mode = 0;  // permission bits
};

class HostFs {
 public:
  explicit HostFs(std::filesystem::path root = "/");

  const std::filesystem::path& root() const { return m_root; }

  // The real path of a host path: "/dev/nvidia0" under root "/host" is "/host/dev/nvidia0".
  std::filesystem::path resolve(std::string_view host_path) const;

  // A regular file's bytes (a FIFO or device is refused after an O_NONBLOCK open); links are
  // followed as the host's programs follow them. More than kMaxReadBytes is an error.
  Result<std::string> read(std::string_view host_path) const;
  // The same, but a link as the last component is refused (ELOOP), never followed: for files
  // that are gpufence's own (its backups), where a link can only be planted.
  Result<std::string> read_own(std::string_view host_path) const;
  static constexpr size_t kMaxReadBytes = size_t{64} << 20;
  bool exists(std::string_view host_path) const;
  // lstat: a symlink is reported as one.
  Result<FileInfo> stat(std::string_view host_path) const;
  // stat: what the path leads to, its links followed as the host follows them (under another
  // root, inside it: the host's /usr/local/bin/x -> /opt/x is the host's /opt/x).
  Result<FileInfo> stat_target(std::string_view host_path) const;
  // Entry names, sorted, without "." and "..".
  Result<std::vector<std::string>> list(std::string_view host_path) const;
  Result<std::string> read_link(std::string_view host_path) const;
  // A path this process can hand to connect(2) for the host's socket at host_path:
  // "/proc/self/fd/N/NAME", N a directory descriptor of its parent opened in the root (the host's
  // links, such as /var/run -> /run, followed as the host follows them), kept open in `dir`.
  // resolve() would name /host/var/run, whose absolute link leads outside the host's root.
  struct SocketPath {
    std::shared_ptr<Fd> dir;
    std::string path;
  };
  Result<SocketPath> socket_path(std::string_view host_path) const;

 private:
  Result<Fd> open(std::string_view host_path, int flags) const;
  Result<std::string> read_regular(std::string_view host_path, int extra_flags) const;
  std::filesystem::path m_root;
};

// A host file's path given on the command line (--config, --drop-in, --containerd-config): an
// absolute one as given; a relative one from the current directory, made absolute and normal,
// but only when the host is this machine's "/" (root "" or "/"): under another --host-root it
// would name a file of wherever the command runs, not the host's, so it is refused, naming
// `flag`. "" stays "" (the flag was not given).
Result<std::string> host_path_arg(const std::string& value, std::string_view flag,
                                  const std::filesystem::path& host_root);

}  // namespace gpufence
