// One process's /proc/<pid>, held open while the doctor reads it. A pid names whichever process
// has it now: between reading a process's cgroup and its environ, its root or its status, the
// process can exit and the pid go to another container's or the host's. Files opened through the
// held directory are that process's, or an error once it has exited, never a later process's
// (docs/trust-model.md, "Files a pod controls, read from the host").
#pragma once

#include <optional>
#include <string>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

class ProcessDir {
 public:
  // /proc/<pid> under the host's root; nullopt when there is no such process (any more).
  static std::optional<ProcessDir> open(const HostFs& host, unsigned pid);

  unsigned pid() const { return m_pid; }
  // A regular file of the process ("cgroup", "environ", "status"), at most `max_bytes` (more is an
  // error naming the limit).
  Result<std::string> read(const std::string& name, size_t max_bytes = size_t{1} << 20) const;
  // The target of a link of the process ("ns/pid": "pid:[4026531836]").
  Result<std::string> link(const std::string& name) const;
  // Its root directory (O_PATH), for common/in_root.hpp.
  Result<Fd> root() const;

 private:
  ProcessDir(Fd dir, unsigned pid) : m_dir(std::move(dir)), m_pid(pid) {}
  Fd m_dir;
  unsigned m_pid = 0;
};

// A process's environ is at most 6 MiB after exec (args and env together, fs/exec.c
// bprm_stack_limits); only prctl(PR_SET_MM) with CAP_SYS_RESOURCE points it at more.
inline constexpr size_t kMaxEnvironBytes = size_t{8} << 20;

}  // namespace gpufence
