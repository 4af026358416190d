// This process's cgroup mount points (/proc/self/mountinfo), for the early cgroupfs-bind refusal
// (mount_guard.hpp). A one-shot process (gpufence-runtime) reads them once; a long-lived one
// (gpufence-nri) keeps them and reads again only after the mount table changed: the kernel marks
// an open /proc/<pid>/mountinfo with POLLPRI after every mount or unmount in its namespace
// (proc(5); fs/proc_namespace.c mounts_poll). A rename of a directory above a mount point moves
// it with no such mark, so each kept point is also checked (statfs) to be a cgroup fs still.
// docs/nri.md
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace gpufence {

// Reads /proc/self/mountinfo now.
Result<std::vector<std::string>> read_cgroup_mount_points();

// The same, kept until the mount table changes. Thread-safe: gpufence-nri decides on its session
// thread and re-judges at Synchronize on another.
class CgroupMountPoints {
 public:
  Result<std::vector<std::string>> get();
  unsigned reads() const { return m_reads; }  // how often the table was read, for tests

 private:
  bool changed();      // with m_mutex held
  bool moved() const;  // a kept point is no longer a cgroup filesystem (with m_mutex held)
  std::mutex m_mutex;
  Fd m_watch;  // /proc/self/mountinfo, open only to be polled
  std::vector<std::string> m_points;
  bool m_valid = false;
  unsigned m_reads = 0;
};

}  // namespace gpufence
