#include "runtime/hooks.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "cdi/hook_defaults.hpp"
#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/in_root.hpp"
#include "common/process.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

std::string fd_path(int fd) {
  return "/proc/self/fd/" + std::to_string(fd);
}

// Creates each missing directory of `rel` inside the root (mode 0755).
Status mkdirs_in_root(int root_fd, const std::string& rel) {
  std::string prefix;
  for (std::string_view part : split(rel, '/')) {
    if (part.empty() || part == ".") continue;
    auto parent = open_in_root(root_fd, prefix.empty() ? "/" : prefix, O_PATH | O_DIRECTORY);
    if (!parent) return std::unexpected(parent.error());
    Fd p(*parent);
    std::string name(part);
    if (::mkdirat(p.fd, name.c_str(), 0755) != 0 && errno != EEXIST)
      return fail_errno("mkdir (inside the container root)", prefix + "/" + name);
    prefix += "/" + name;
  }
  return {};
}

Status write_in_root(int root_fd, const std::string& dir, const std::string& name,
                     const std::string& content) {
  auto d = open_in_root(root_fd, dir, O_PATH | O_DIRECTORY);
  if (!d) return std::unexpected(d.error());
  Fd dfd(*d);
  // Created O_EXCL|O_NOFOLLOW beside the name, as every temp file of gpufence's (common/file.hpp).
  auto created = create_temp_for(dfd.fd, name, "(inside the container root) " + dir);
  if (!created) return std::unexpected(created.error());
  const Fd file = std::move(created->fd);
  const std::string tmp = std::move(created->name);
  if (::fchmod(file.fd, 0644) != 0) {
    int err = errno;
    ::unlinkat(dfd.fd, tmp.c_str(), 0);
    return fail_errno("chmod (inside the container root)", dir + "/" + tmp, err);
  }
  if (::write(file.fd, content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    ::unlinkat(dfd.fd, tmp.c_str(), 0);
    return fail_errno("write (inside the container root)", dir + "/" + tmp);
  }
  // renameat replaces a link at `name` itself; it never follows it.
  if (::renameat(dfd.fd, tmp.c_str(), dfd.fd, name.c_str()) != 0) {
    int err = errno;
    ::unlinkat(dfd.fd, tmp.c_str(), 0);
    return fail_errno("rename (inside the container root)", dir + "/" + name, err);
  }
  return {};
}

// `ldconfig -r ROOT` only chroots. At createContainer time the container's root already has its
// procfs (and sysfs) mounted, and procfs has magic links out of any chroot: /proc/1/root is the
// host's "/". An image with /var/cache/ldconfig or /etc -> /proc/1/root/... would have ldconfig
// write on the host. So ldconfig runs in a private mount namespace in which the root's /proc and
// /sys are covered by empty read-only tmpfs; if that cannot be set up, it does not run.
Result<ProcessResult> run_ldconfig_confined(const std::string& ldconfig,
                                            const std::filesystem::path& rootfs, int root_fd,
                                            std::chrono::milliseconds timeout) {
  char tmpl[] = "/tmp/gpufence-ldconfig-XXXXXX";
  int out_fd = ::mkostemp(tmpl, O_CLOEXEC);
  if (out_fd < 0) return fail_errno("mkostemp", tmpl);
  ::unlink(tmpl);
  Fd out(out_fd);
  (void)root_fd;  // the child resolves again: a descriptor opened here names the old namespace
  std::vector<std::string> env = kMinimalHookEnv;
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string root = rootfs.string();
  std::string arg0 = ldconfig, arg1 = "-r";
  char* argv[] = {arg0.data(), arg1.data(), root.data(), nullptr};
  pid_t pid = ::fork();
  if (pid < 0) return fail_errno("fork", ldconfig);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0) ::_exit(125);
    // Private first, so the covers below never propagate into the container's namespace.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(125);
    // Mount targets must be resolved in this namespace, and inside the root (an image's /proc
    // may be a symlink; runc mounted procfs where it resolves inside the root).
    int new_root = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (new_root < 0) ::_exit(125);
    for (const char* dir : {"proc", "sys"}) {
      auto fd = open_in_root(new_root, dir, O_PATH | O_DIRECTORY);
      if (!fd) {
        if (fd.error().code == Errc::not_found) continue;
        ::_exit(125);
      }
      std::string target = fd_path(*fd);
      if (::mount("tmpfs", target.c_str(), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,mode=0555") != 0)
        ::_exit(125);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull < 0 || ::dup2(devnull, 0) < 0 || ::dup2(out.fd, 1) < 0 || ::dup2(out.fd, 2) < 0)
      ::_exit(125);
    ::execve(argv[0], argv, envp.data());
    ::_exit(127);
  }
  ProcessResult result = wait_for_exit(pid, timeout);
  if (result.exit_code == 125)
    return fail(Errc::io, "cannot confine ", ldconfig, " (private mount namespace): not run");
  ::lseek(out.fd, 0, SEEK_SET);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out.fd, buf, sizeof buf)) > 0) result.out.append(buf, static_cast<size_t>(n));
  return result;
}

}  // namespace

Result<HookContainer> container_from_state(std::string_view state_json) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(state_json);
  } catch (const nlohmann::json::exception& e) {
    return fail(Errc::parse, "hook: container state on stdin is not JSON: ", e.what());
  }
  if (!state.is_object() || !state.contains("bundle") || !state["bundle"].is_string())
    return fail(Errc::parse, "hook: container state has no bundle");
  std::string bundle = state["bundle"].get<std::string>();
  if (bundle.empty() || bundle.front() != '/')
    return fail(Errc::parse, "hook: container state's bundle '", bundle, "' is not absolute");
  auto config = read_file(std::filesystem::path(bundle) / "config.json");
  if (!config) return std::unexpected(config.error());
  HookContainer out;
  try {
    auto spec = nlohmann::json::parse(*config);
    std::filesystem::path root = spec.at("root").at("path").get<std::string>();
    out.rootfs = root.is_absolute() ? root : std::filesystem::path(bundle) / root;
    if (auto lin = spec.find("linux"); lin != spec.end() && lin->is_object()) {
      if (auto ns = lin->find("namespaces"); ns != lin->end() && ns->is_array()) {
        for (const auto& n : *ns)
          if (n.is_object() && n.value("type", "") == "cgroup") out.cgroupns = CgroupNamespace::own;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return fail(Errc::parse, "hook: ", bundle, "/config.json has no root.path: ", e.what());
  }
  return out;
}

Status check_cgroup_mounts(const HookContainer& container, const std::string& mountinfo_path) {
  // mountinfo names mount points by their real paths; runc binds the root onto itself there.
  char real[PATH_MAX];
  if (!::realpath(container.rootfs.c_str(), real))
    return fail_errno("realpath", container.rootfs.native());
  // This hook runs in the container's mount namespace, so its own table is the container's.
  auto mountinfo = read_file(mountinfo_path);
  if (!mountinfo) return std::unexpected(mountinfo.error());
  return check_container_cgroup_mounts(*mountinfo, real, container.cgroupns);
}

Status narrow_directory(const std::filesystem::path& rootfs, const std::string& dir,
                        const std::vector<std::string>& keep) {
  for (const auto& name : keep) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return fail(Errc::invalid_argument, "hook: bad entry name '", name, "'");
  }
  auto root = open_root_dir(rootfs);
  if (!root) return std::unexpected(root.error());
  auto d = open_in_root(root->fd, dir, O_PATH | O_DIRECTORY);
  if (!d) {
    if (d.error().code == Errc::not_found) return {};  // no driver directory in this container
    return std::unexpected(d.error());
  }
  Fd dir_fd(*d);
  // Hold each kept entry by an O_PATH descriptor: once the tmpfs covers `dir` they are
  // unreachable by name, but /proc/self/fd/N still names them for the bind mount back.
  struct Kept {
    std::string name;
    Fd fd;
    bool is_dir;
  };
  std::vector<Kept> kept;
  for (const auto& name : keep) {
    int fd = ::openat(dir_fd.fd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue;
      return fail_errno("open", dir + "/" + name);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))) {
      ::close(fd);
      return fail(Errc::invalid_argument, "hook: ", dir, "/", name, " is neither file nor dir");
    }
    kept.push_back({name, Fd(fd), S_ISDIR(st.st_mode)});
  }
  if (::mount("tmpfs", fd_path(dir_fd.fd).c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0755,size=64k") != 0)
    return fail_errno("mount tmpfs on", dir);
  // The tmpfs now covers the directory; reopen by the same in-root path to reach it.
  auto t = open_in_root(root->fd, dir, O_PATH | O_DIRECTORY);
  if (!t) return std::unexpected(t.error());
  Fd tmpfs(*t);
  for (const auto& k : kept) {
    int made = k.is_dir ? ::mkdirat(tmpfs.fd, k.name.c_str(), 0555)
                        : ::openat(tmpfs.fd, k.name.c_str(),
                                   O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0444);
    if (made < 0) return fail_errno("create mount point", dir + "/" + k.name);
    if (!k.is_dir) ::close(made);
    int target = ::openat(tmpfs.fd, k.name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (target < 0) return fail_errno("open mount point", dir + "/" + k.name);
    Fd target_fd(target);
    if (::mount(fd_path(k.fd.fd).c_str(), fd_path(target_fd.fd).c_str(), nullptr, MS_BIND | MS_REC,
                nullptr) != 0)
      return fail_errno("bind mount back", dir + "/" + k.name);
  }
  if (::mount("tmpfs", fd_path(tmpfs.fd).c_str(), "tmpfs",
              MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555") != 0)
    return fail_errno("remount read-only", dir);
  return {};
}

Status update_ldcache(const std::filesystem::path& rootfs, const std::vector<std::string>& folders,
                      const std::string& ldconfig_override, std::chrono::milliseconds timeout) {
  std::string conf;
  for (const auto& f : folders) {
    if (f.empty() || f.front() != '/' || f.find('\n') != std::string::npos)
      return fail(Errc::invalid_argument, "hook: bad library folder '", f, "'");
    conf += f + "\n";
  }
  auto root = open_root_dir(rootfs);
  if (!root) return std::unexpected(root.error());
  if (auto st = mkdirs_in_root(root->fd, "etc/ld.so.conf.d"); !st) return st;
  if (auto st = write_in_root(root->fd, "etc/ld.so.conf.d", "00-gpufence-cdi.conf", conf); !st)
    return st;
  // The host's ldconfig by absolute path, never the container's PATH; `-r` makes it chroot into
  // the container's root before it reads or writes anything.
  std::string ldconfig = ldconfig_override;
  if (ldconfig.empty()) {
    for (const char* candidate : {"/sbin/ldconfig", "/usr/sbin/ldconfig"}) {
      if (::access(candidate, X_OK) == 0) {
        ldconfig = candidate;
        break;
      }
    }
  }
  if (ldconfig.empty() || ldconfig.front() != '/')
    return fail(Errc::not_found, "no ldconfig at /sbin or /usr/sbin on the host");
  auto r = run_ldconfig_confined(ldconfig, rootfs, root->fd, timeout);
  if (!r) return std::unexpected(r.error());
  if (r->timed_out) return fail(Errc::io, ldconfig, " -r ", rootfs.string(), " timed out");
  if (r->exit_code != 0)
    return fail(Errc::io, ldconfig, " -r ", rootfs.string(), " failed: ", trim(r->out));
  return {};
}

int run_hook(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr
        << "gpufence-runtime hook: which hook? (cgroup-mounts, driver-procfs, update-ldcache)\n";
    return 2;
  }
  std::string state((std::istreambuf_iterator<char>(std::cin)), {});
  auto container = container_from_state(state);
  if (!container) {
    std::cerr << "gpufence-runtime hook " << args[0] << ": " << container.error().message << "\n";
    return 1;
  }
  const auto& rootfs = container->rootfs;
  if (args[0] == "cgroup-mounts") {
    // Isolation: the mount table after runc made every mount, before the process starts.
    if (args.size() != 1) {
      std::cerr << "gpufence-runtime hook cgroup-mounts: takes no arguments\n";
      return 2;
    }
    if (auto st = check_cgroup_mounts(*container); !st) {
      std::cerr << "gpufence-runtime: refusing to start the container: "
                << escape_text(st.error().message) << "\n";
      return 1;
    }
    return 0;
  }
  std::vector<std::string> values;
  std::string dir;
  for (size_t i = 1; i < args.size(); i += 2) {
    if (i + 1 >= args.size()) {
      std::cerr << "gpufence-runtime hook " << args[0] << ": flag " << args[i]
                << " needs a value\n";
      return 2;
    }
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
    auto st = narrow_directory(rootfs, dir, values);
    if (!st) {
      std::cerr << "gpufence-runtime hook driver-procfs: " << st.error().message << "\n";
      return 1;
    }
    return 0;
  }
  if (args[0] == "update-ldcache") {
    // Convenience, not isolation: a read-only root or a missing ldconfig must not stop the
    // container (the libraries sit in standard directories anyway).
    auto st = update_ldcache(rootfs, values);
    if (!st)
      std::cerr << "gpufence-runtime hook update-ldcache: warning: " << st.error().message << "\n";
    return 0;
  }
  std::cerr << "gpufence-runtime hook: unknown hook '" << args[0] << "'\n";
  return 2;
}

}  // namespace gpufence
