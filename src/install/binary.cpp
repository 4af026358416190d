#include "install/binary.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "common/file.hpp"

namespace gpufence {
namespace {

namespace fs = std::filesystem;

// Versioned files are named after the stable link (gpufence-runtime-<hash>, gpufence-nri-<hash>),
// so two binaries share one versions directory without one's prune removing the other's files.
std::string version_prefix(const BinaryInstallOptions& opt) {
  return fs::path(opt.link).filename().string() + "-";
}

Status fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail_errno("open", dir.native());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return fail_errno("fsync", dir.native(), err);
  return {};
}

// The host path `link` points at, if it is a symlink.
std::optional<std::string> link_target(const HostFs& host, const std::string& link) {
  auto t = host.read_link(link);
  if (!t) return std::nullopt;
  return *t;
}

Status swap_link(const HostFs& host, const std::string& link, const std::string& target) {
  fs::path real = host.resolve(link);
  std::error_code ec;
  fs::create_directories(real.parent_path(), ec);
  if (ec) return fail(Errc::io, "create ", real.parent_path().native(), ": ", ec.message());
  // The new link is made under a temp name of the one rule (common/file.hpp), so a killed run's
  // leftover is recognised like any other writer's. symlink(2) never replaces nor follows what
  // is at its name: a taken name (EEXIST) moves on to the next attempt.
  // The link holds the host path, so it resolves on the host whatever our own root is.
  constexpr unsigned kAttempts = 100;  // as many as create_temp_for tries for a file
  fs::path tmp;
  for (unsigned attempt = 0;; ++attempt) {
    tmp = real.parent_path() / temp_name_for(real.filename().native(), attempt);
    if (::symlink(target.c_str(), tmp.c_str()) == 0) break;
    if (errno != EEXIST || attempt + 1 == kAttempts) return fail_errno("symlink", tmp.native());
  }
  if (::rename(tmp.c_str(), real.c_str()) != 0) {
    auto err = fail_errno("rename", real.native());
    ::unlink(tmp.c_str());
    return err;
  }
  return fsync_dir(real.parent_path());
}

}  // namespace

std::string content_tag(std::string_view bytes) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[static_cast<size_t>(i)] = kHex[h & 15];
  return out;
}

namespace {

Result<std::string> read_source(const BinaryInstallOptions& opt) {
  auto bytes = read_file(opt.source);
  if (!bytes)
    return std::unexpected(
        bytes.error().wrap(cat("read ", fs::path(opt.link).filename().string(), " to install")));
  if (bytes->size() < 4 || bytes->compare(0, 4,
                                          "\x7f"
                                          "ELF") != 0)
    return fail(Errc::invalid_argument, opt.source, " is not an ELF executable");
  return bytes;
}

}  // namespace

Result<std::string> planned_binary_target(const BinaryInstallOptions& opt) {
  auto bytes = read_source(opt);
  if (!bytes) return std::unexpected(bytes.error());
  return cat(opt.versions_dir, "/", version_prefix(opt), content_tag(*bytes));
}

std::optional<std::string> binary_link_target(const HostFs& host, const std::string& link) {
  return link_target(host, link);
}

Status point_binary_link(const HostFs& host, const std::string& link, const std::string& target) {
  return swap_link(host, link, target);
}

Result<BinaryInstall> install_binary(const HostFs& host, const BinaryInstallOptions& opt) {
  auto bytes = read_source(opt);
  if (!bytes) return std::unexpected(bytes.error());
  BinaryInstall out;
  out.target = cat(opt.versions_dir, "/", version_prefix(opt), content_tag(*bytes));
  fs::path real_target = host.resolve(out.target);

  // Step 1: the versioned file, unless an identical one is already there.
  auto existing = read_file(real_target);
  if (!existing || *existing != *bytes) {
    std::error_code ec;
    fs::create_directories(real_target.parent_path(), ec);
    if (ec)
      return fail(Errc::io, "create ", real_target.parent_path().native(), ": ", ec.message());
    if (auto st = write_file_atomic(real_target, *bytes); !st) return std::unexpected(st.error());
    if (::chmod(real_target.c_str(), 0755) != 0) return fail_errno("chmod", real_target.native());
    out.changed = Changed::yes;
  }
  // write_file_atomic keeps an old file's mode; a reused file must still be executable.
  struct stat st {};
  if (::stat(real_target.c_str(), &st) == 0 && (st.st_mode & 0111) != 0111) {
    if (::chmod(real_target.c_str(), 0755) != 0) return fail_errno("chmod", real_target.native());
    out.changed = Changed::yes;
  }

  // Step 2: the stable name, swapped in one rename.
  auto previous = link_target(host, opt.link);
  if (previous != out.target) {
    if (auto s = swap_link(host, opt.link, out.target); !s) return std::unexpected(s.error());
    out.changed = Changed::yes;
  }

  // Step 3: keep the version just replaced (a create may still be exec'ing it), drop older ones.
  auto entries = host.list(opt.versions_dir);
  if (entries) {
    for (const auto& name : *entries) {
      // A temp file is hidden, so never takes the prefix; said outright all the same.
      if (!name.starts_with(version_prefix(opt)) || temp_target_name(name)) continue;
      std::string path = cat(opt.versions_dir, "/", name);
      if (path == out.target || (previous && path == *previous)) continue;
      if (::unlink(host.resolve(path).c_str()) == 0) out.pruned.push_back(path);
    }
  }
  return out;
}

Result<std::vector<std::string>> remove_binary(const HostFs& host,
                                               const BinaryInstallOptions& opt) {
  std::vector<std::string> removed;
  auto target = link_target(host, opt.link);
  if (target && target->starts_with(opt.versions_dir + "/")) {
    if (::unlink(host.resolve(opt.link).c_str()) != 0)
      return fail_errno("unlink", host.resolve(opt.link).native());
    removed.push_back(opt.link);
  }
  auto entries = host.list(opt.versions_dir);
  if (entries) {
    for (const auto& name : *entries) {
      if (!name.starts_with(version_prefix(opt))) continue;
      std::string path = cat(opt.versions_dir, "/", name);
      if (::unlink(host.resolve(path).c_str()) != 0)
        return fail_errno("unlink", host.resolve(path).native());
      removed.push_back(path);
    }
    ::rmdir(host.resolve(opt.versions_dir).c_str());  // only if now empty
  }
  return removed;
}

}  // namespace gpufence
