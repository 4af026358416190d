// One `gpufence install` or `uninstall` at a time on a node. Two runs at once would each plan
// from the files as the other left them half way, and a failing one's undo (which judges "this
// run wrote it" by the text a file holds) could put the user's config back under a run that
// succeeded. So every run holds an exclusive flock(2) on a lock file in gpufence's state
// directory (beside install-state.json) from before it reads the record until it is done; a
// second run waits for it, a bounded time, then fails having changed nothing (docs/install.md,
// "One run at a time").
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

// How long a run waits for another to finish, on the clock install's seams give it.
struct LockWait {
  std::chrono::milliseconds timeout{60'000};
  std::function<void(std::chrono::milliseconds)> sleep;
  std::function<std::chrono::steady_clock::time_point()> now;
  // Told once, when the run starts to wait (the line names the holder's pid).
  std::function<void(std::string_view line)> waiting = {};
};

// The lock file of a state file: "<its directory>/install.lock".
std::string install_lock_path(const std::string& state_file);

class InstallLock {
 public:
  // Takes the lock at host path `path`. The file is gpufence's own: created 0600 with O_EXCL
  // where missing, an existing one taken only when it is a regular file of this user with one
  // link, and no component of the path may be a symbolic link (open_append_checked,
  // Symlinks::none), so a link planted there is refused, never followed. Missing directories on
  // the way are made 0755, as install makes its state directory. While another process holds
  // it, waits up to `wait.timeout`, then fails naming the holder's pid (the holder writes it
  // into the file while it holds the lock).
  static Result<InstallLock> acquire(const HostFs& host, const std::string& path,
                                     const LockWait& wait);

  InstallLock(InstallLock&&) = default;
  InstallLock& operator=(InstallLock&&) = default;
  ~InstallLock() { release(false); }
  InstallLock(const InstallLock&) = delete;
  InstallLock& operator=(const InstallLock&) = delete;

  // Unlocks. `nothing_installed` (no state file is left): the lock file goes too, then the
  // directories this acquisition made for it and `also_remove` (uninstall's: the ones install
  // made), deepest first, each only when empty. A run waiting on the file just removed sees
  // that it holds an unlinked file once it gets the lock, and takes it again on a new one.
  void release(bool nothing_installed, const std::vector<std::string>& also_remove = {});

  const std::string& path() const { return m_path; }
  // How long this run waited for another, and that one's pid when the file named it.
  std::chrono::milliseconds waited() const { return m_waited; }
  std::optional<long> waited_for() const { return m_waited_for; }
  // The directories made for the lock file (host paths, parents first): install records them
  // with the ones it creates, so uninstall takes them back.
  const std::vector<std::string>& made_dirs() const { return m_made_dirs; }

 private:
  InstallLock(const HostFs& host, std::string path) : m_host(&host), m_path(std::move(path)) {}
  const HostFs* m_host;
  std::string m_path;
  Fd m_fd;
  std::vector<std::string> m_made_dirs;  // host paths of the directories it made, parents first
  std::chrono::milliseconds m_waited{0};
  std::optional<long> m_waited_for;
};

}  // namespace gpufence
