#include "install/lock.hpp"

#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "common/file.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// The directories missing on the way to `path`, made 0755 (parents first): what install's state
// directory gets when install writes its record there.
Status make_parents(const HostFs& host, const std::string& path, std::vector<std::string>& made) {
  std::vector<std::string> chain;
  for (fs::path d = fs::path(path).parent_path(); !d.empty() && d != d.root_path();
       d = d.parent_path()) {
    if (host.stat(d.string())) break;
    chain.push_back(d.string());
  }
  for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
    if (::mkdir(host.resolve(*c).c_str(), 0755) == 0)
      made.push_back(*c);
    else if (errno != EEXIST)
      return fail_errno("mkdir", *c);
  }
  return {};
}

// Whether `fd` is still the file at `real` (an unlinked or replaced one is no lock at all).
bool still_the_file(int fd, const fs::path& real) {
  struct stat held {
  }, now{};
  if (::fstat(fd, &held) != 0 || held.st_nlink == 0) return false;
  if (::lstat(real.c_str(), &now) != 0) return false;
  return held.st_dev == now.st_dev && held.st_ino == now.st_ino;
}

// The pid the holder wrote, when the file names one.
std::optional<long> holder_pid(const HostFs& host, const std::string& path) {
  auto text = host.read_own(path);
  if (!text) return std::nullopt;
  auto pid = parse_number<long>(trim(*text));
  if (!pid || *pid <= 0) return std::nullopt;
  return pid;
}

std::string seconds_text(milliseconds d) {
  return cat(d.count() / 1000.0, " s");
}

}  // namespace

std::string install_lock_path(const std::string& state_file) {
  return (fs::path(state_file).parent_path() / "install.lock").string();
}

Result<InstallLock> InstallLock::acquire(const HostFs& host, const std::string& path,
                                         const LockWait& wait) {
  InstallLock lock(host, path);
  const fs::path real = host.resolve(path);
  const auto started = wait.now();
  const auto deadline = started + wait.timeout;
  bool told = false;
  while (true) {
    if (auto st = make_parents(host, path, lock.m_made_dirs); !st)
      return std::unexpected(st.error());
    auto fd = open_append_checked(real, Symlinks::none, 0600);
    if (!fd) return std::unexpected(fd.error().wrap(cat("install lock ", path)));
    if (::flock(fd->fd, LOCK_EX | LOCK_NB) == 0) {
      // The holder before may have removed the file (an uninstall, a run that left nothing
      // installed) after this run opened it: then take the lock again on the file there now.
      if (!still_the_file(fd->fd, real)) continue;
      // The pid, for a run that comes to wait: only while the lock is held.
      std::string pid = cat(::getpid(), "\n");
      if (::ftruncate(fd->fd, 0) != 0 || ::write(fd->fd, pid.data(), pid.size()) < 0)
        return fail_errno("write", path);
      lock.m_fd = std::move(*fd);
      lock.m_waited = std::chrono::duration_cast<milliseconds>(wait.now() - started);
      return lock;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return fail_errno("flock", path);
    auto pid = holder_pid(host, path);
    if (pid) lock.m_waited_for = pid;
    const std::string who = pid ? cat("another gpufence install or uninstall (pid ", *pid, ")")
                                : std::string("another gpufence install or uninstall");
    const auto now = wait.now();
    if (now >= deadline)
      return fail(Errc::conflict, who, " holds ", path, "; waited ", seconds_text(wait.timeout),
                  " (--lock-timeout) for it to finish: nothing was changed, run again once it "
                  "is done");
    if (!told && wait.waiting) {
      wait.waiting(cat("waiting for ", who, " to finish (", path, ", up to ",
                       seconds_text(wait.timeout), ")"));
      told = true;
    }
    wait.sleep(
        std::min(milliseconds(100),
                 std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1)));
  }
}

void InstallLock::release(bool nothing_installed, const std::vector<std::string>& also_remove) {
  if (m_fd.fd < 0) return;
  if (nothing_installed) {
    // Removed while still held: a run that opened it meanwhile finds it unlinked once it gets
    // the lock (still_the_file), and starts again on a new file.
    ::unlink(m_host->resolve(m_path).c_str());
    std::vector<std::string> dirs = m_made_dirs;
    dirs.insert(dirs.end(), also_remove.begin(), also_remove.end());
    // Deepest first: a directory's path is longer than its parent's.
    std::stable_sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) {
      return a.size() > b.size();
    });
    for (const auto& d : dirs) ::rmdir(m_host->resolve(d).c_str());
  } else {
    (void)!::ftruncate(m_fd.fd, 0);  // the pid only while it is held
  }
  m_fd = Fd();  // close: the lock goes with the last descriptor of the open file
}

}  // namespace gpufence
