#include "runtime/hooks.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "common/file.hpp"
#include "common/process.hpp"
#include "common/strings.hpp"

namespace gpufence {

Result<std::filesystem::path> rootfs_from_state(std::string_view state_json) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(state_json);
  } catch (const nlohmann::json::exception& e) {
    return fail(Errc::parse, "hook: container state on stdin is not JSON: ", e.what());
  }
  std::string bundle = state.value("bundle", "");
  if (bundle.empty()) return fail(Errc::parse, "hook: container state has no bundle");
  auto config = read_file(std::filesystem::path(bundle) / "config.json");
  if (!config) return std::unexpected(config.error());
  std::string root;
  try {
    root = nlohmann::json::parse(*config).at("root").at("path").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return fail(Errc::parse, "hook: ", bundle, "/config.json has no root.path: ", e.what());
  }
  std::filesystem::path rootfs = root;
  return rootfs.is_absolute() ? rootfs : std::filesystem::path(bundle) / rootfs;
}

Status narrow_directory(const std::filesystem::path& dir, const std::vector<std::string>& keep) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return {};  // no driver directory in this container
  // Hold each kept entry by an O_PATH descriptor: once the tmpfs covers `dir` they are
  // unreachable by name, but /proc/self/fd/N still names them for the bind mount back.
  struct Kept {
    std::string name;
    int fd;
    bool is_dir;
  };
  std::vector<Kept> kept;
  auto close_all = [&] {
    for (auto& k : kept) ::close(k.fd);
  };
  for (const auto& name : keep) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      close_all();
      return fail(Errc::invalid_argument, "hook: bad entry name '", name, "'");
    }
    auto path = dir / name;
    int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT) continue;
      close_all();
      return fail_errno("open", path.native());
    }
    struct stat est {};
    ::fstat(fd, &est);
    kept.push_back({name, fd, S_ISDIR(est.st_mode)});
  }
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0555,size=64k") != 0) {
    close_all();
    return fail_errno("mount tmpfs on", dir.native());
  }
  for (const auto& k : kept) {
    auto target = dir / k.name;
    if (k.is_dir) {
      if (::mkdir(target.c_str(), 0555) != 0) {
        close_all();
        return fail_errno("mkdir", target.native());
      }
    } else {
      int f = ::open(target.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0444);
      if (f < 0) {
        close_all();
        return fail_errno("create", target.native());
      }
      ::close(f);
    }
    std::string source = "/proc/self/fd/" + std::to_string(k.fd);
    if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      close_all();
      return fail_errno("bind mount back", target.native());
    }
  }
  close_all();
  if (::mount("tmpfs", dir.c_str(), "tmpfs",
              MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555") != 0) {
    return fail_errno("remount read-only", dir.native());
  }
  return {};
}

Status update_ldcache(const std::filesystem::path& rootfs,
                      const std::vector<std::string>& folders) {
  std::string conf;
  for (const auto& f : folders) conf += f + "\n";
  std::error_code ec;
  std::filesystem::create_directories(rootfs / "etc/ld.so.conf.d", ec);
  if (auto st = write_file_atomic(rootfs / "etc/ld.so.conf.d/00-gpufence-cdi.conf", conf,
                                  Durability::none);
      !st) {
    return st;
  }
  std::string ldconfig = ::access("/sbin/ldconfig", X_OK) == 0 ? "/sbin/ldconfig" : "ldconfig";
  auto r = run_process({ldconfig, "-r", rootfs.string()});
  if (!r) return std::unexpected(r.error());
  if (r->exit_code != 0)
    return fail(Errc::io, "ldconfig -r ", rootfs.string(), " failed: ", trim(r->out));
  return {};
}

int run_hook(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << "gpufence-runtime hook: which hook? (driver-procfs, update-ldcache)\n";
    return 2;
  }
  std::string state((std::istreambuf_iterator<char>(std::cin)), {});
  auto rootfs = rootfs_from_state(state);
  if (!rootfs) {
    std::cerr << "gpufence-runtime hook " << args[0] << ": " << rootfs.error().message << "\n";
    return 1;
  }
  std::vector<std::string> values;
  std::string dir;
  for (size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--dir")
      dir = args[i + 1];
    else if (args[i] == "--keep" || args[i] == "--folder")
      values.push_back(args[i + 1]);
    else {
      std::cerr << "gpufence-runtime hook " << args[0] << ": unknown flag " << args[i] << "\n";
      return 2;
    }
  }
  if (args[0] == "driver-procfs") {
    // Isolation: failing here stops the container rather than showing it every GPU.
    auto st = narrow_directory(*rootfs / std::filesystem::path(dir).relative_path(), values);
    if (!st) {
      std::cerr << "gpufence-runtime hook driver-procfs: " << st.error().message << "\n";
      return 1;
    }
    return 0;
  }
  if (args[0] == "update-ldcache") {
    // Convenience, not isolation: a read-only root or a missing ldconfig must not stop the
    // container (the libraries sit in standard directories anyway).
    auto st = update_ldcache(*rootfs, values);
    if (!st)
      std::cerr << "gpufence-runtime hook update-ldcache: warning: " << st.error().message << "\n";
    return 0;
  }
  std::cerr << "gpufence-runtime hook: unknown hook '" << args[0] << "'\n";
  return 2;
}

}  // namespace gpufence
