#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/in_root.hpp"
#include "common/strings.hpp"
#include "doctor/gather.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

namespace {
constexpr int kProbeInconclusive = 3;  // the child's exit status for an open that tells nothing
}  // namespace

ProbeOpen probe_open_verdict(int err) {
  // Success, or ENXIO/ENODEV: the cgroup let the open through to a driver with no such device.
  if (err == 0 || err == ENXIO || err == ENODEV) return ProbeOpen::allowed;
  if (err == EPERM) return ProbeOpen::denied;  // the devices cgroup (v1 list, v2 BPF program)
  return ProbeOpen::inconclusive;
}

Result<std::set<unsigned>> probe_gpu_access(const HostFs& host, unsigned pid,
                                            const std::string& cgroup_procs_file,
                                            const std::set<unsigned>& minors,
                                            std::chrono::milliseconds timeout) {
  // Temporary nodes for GPUs the container has no node for, made here (host cgroup) and opened
  // by the child (container cgroup): the open is what the container's cgroup would allow.
  // Under $TMPDIR (the caller's, root's own environment) or /tmp; it must allow device nodes.
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(tmpdir && *tmpdir == '/' ? tmpdir : "/tmp") + "/gpufence-probe-XXXXXX";
  if (!::mkdtemp(tmpl.data())) return fail_errno("mkdtemp", tmpl);
  // /tmp is often a pod's hostPath: everything below goes through the descriptor of the directory
  // mkdtemp made, never its name again, so a pod that renames it and leaves a link in its place
  // decides nothing (docs/trust-model.md, "Where root writes").
  Fd dir{::open(tmpl.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (dir.fd < 0) return fail_errno("open", tmpl);
  std::vector<std::string> made_names;
  auto cleanup = [&] {
    for (const auto& name : made_names) ::unlinkat(dir.fd, name.c_str(), 0);
    ::unlinkat(AT_FDCWD, tmpl.c_str(), AT_REMOVEDIR);  // never follows a link left in its place
  };
  std::vector<std::pair<unsigned, std::string>> targets;
  // The container's own node for GPU m only if /dev/nvidiaM inside its root is that node (195:m):
  // held by an O_PATH descriptor and reopened through it, so no link of the container's can make
  // this process open something else (common/in_root.hpp).
  auto root = open_root_dir(host.resolve(cat("/proc/", pid, "/root")));
  std::vector<Fd> held;
  for (unsigned m : minors) {
    if (root) {
      if (auto node = char_device_in_root(root->fd, cat("/dev/nvidia", m), kNvidiaMajor, m)) {
        targets.emplace_back(m, cat("/proc/self/fd/", node->fd));
        held.push_back(std::move(*node));
        continue;
      }
    }
    std::string name = cat("nvidia", m);
    if (::mknodat(dir.fd, name.c_str(), S_IFCHR | 0600, makedev(kNvidiaMajor, m)) != 0) {
      auto err = fail_errno("mknod", tmpl + "/" + name);
      cleanup();
      return err;
    }
    made_names.push_back(name);
    Fd node{::openat(dir.fd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC)};
    struct stat st {};
    if (node.fd < 0 || ::fstat(node.fd, &st) != 0 || !S_ISCHR(st.st_mode) ||
        st.st_rdev != makedev(kNvidiaMajor, m)) {
      cleanup();
      return fail(Errc::io, "probe node ", tmpl, "/", name, " is not the node just made");
    }
    targets.emplace_back(m, cat("/proc/self/fd/", node.fd));
    held.push_back(std::move(node));
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    cleanup();
    return fail_errno("pipe for probe of", std::to_string(pid));
  }
  pid_t child = ::fork();
  if (child < 0) {
    cleanup();
    return fail_errno("fork probe for", std::to_string(pid));
  }
  if (child == 0) {
    // Child: join the container's devices cgroup, try each node, report, exit.
    ::close(fds[0]);
    // "0" moves the writer itself (cgroups(7)): nothing to format after fork.
    // Only into a cgroup: the file must be on a cgroup filesystem, never a host file that a
    // path happened to name (docs/trust-model.md).
    int cg = ::open(cgroup_procs_file.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
    struct statfs fs {};
    if (cg < 0 || ::fstatfs(cg, &fs) != 0 ||
        (fs.f_type != CGROUP_SUPER_MAGIC && fs.f_type != CGROUP2_SUPER_MAGIC) ||
        ::write(cg, "0", 1) < 0) {
      char fail_byte = 'F';
      [[maybe_unused]] auto n = ::write(fds[1], &fail_byte, 1);
      ::_exit(1);
    }
    ::close(cg);
    for (const auto& [m, path] : targets) {
      int fd = ::open(path.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC);
      auto verdict = probe_open_verdict(fd >= 0 ? 0 : errno);
      if (fd >= 0) ::close(fd);
      // Only EPERM is the cgroup's "no": any other error (ENOMEM in a cgroup held at
      // memory.max, EACCES on a nodev mount) says nothing about access, and counting it as
      // denied would hide a GPU the container can open.
      if (verdict == ProbeOpen::inconclusive) ::_exit(kProbeInconclusive);
      if (verdict == ProbeOpen::allowed) {
        unsigned char b = static_cast<unsigned char>(m);
        [[maybe_unused]] auto n = ::write(fds[1], &b, 1);
      }
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  // Bounded: on cgroup v2 the child joins the container's whole cgroup, and a container that can
  // write it (privileged) can freeze it (cgroup.freeze) or hold it at memory.max; the doctor must
  // still finish. SIGKILL ends a frozen task too (docs/trust-model.md, "Files a pod controls").
  std::string bytes;
  bool timed_out = false;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    struct pollfd p {
      fds[0], POLLIN, 0
    };
    int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = true;
      break;
    }
    char buf[256];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  cleanup();
  if (timed_out) {
    return fail(Errc::io, "probe joining ", cgroup_procs_file, " did not finish within ",
                std::to_string(timeout.count()), " ms (a frozen or full cgroup?): killed");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kProbeInconclusive) {
    return fail(Errc::io, "probe in ", cgroup_procs_file,
                ": opening a GPU node failed with an error other than EPERM, which says nothing "
                "about access: inconclusive");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return fail(Errc::io, "probe could not join ", cgroup_procs_file,
                " (not a file of a cgroup filesystem, or the kernel refused the write)");
  }
  std::set<unsigned> allowed;
  for (unsigned char b : bytes) allowed.insert(b);
  return allowed;
}

}  // namespace gpufence
