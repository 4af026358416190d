#include "doctor/process_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.hpp"
#include "common/strings.hpp"

namespace gpufence {

std::optional<ProcessDir> ProcessDir::open(const HostFs& host, unsigned pid) {
  auto path = host.resolve(cat("/proc/", pid));
  int fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  return ProcessDir(Fd(fd), pid);
}

Result<std::string> ProcessDir::read(const std::string& name, size_t max_bytes) const {
  std::string where = cat("/proc/", m_pid, "/", name);
  Fd f{::openat(m_dir.fd, name.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC)};
  if (f.fd < 0) return fail_errno("open", where);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fail_errno("stat", where);
  if (!S_ISREG(st.st_mode)) return fail(Errc::invalid_argument, where, " is not a regular file");
  auto text = read_fd(f.fd, where, max_bytes);
  if (!text && text.error().code == Errc::invalid_argument)
    return fail(Errc::invalid_argument, text.error().message, ": not read");
  return text;
}

Result<std::string> ProcessDir::link(const std::string& name) const {
  char buf[256];
  ssize_t n = ::readlinkat(m_dir.fd, name.c_str(), buf, sizeof buf);
  if (n < 0) return fail_errno("readlink", cat("/proc/", m_pid, "/", name));
  if (static_cast<size_t>(n) == sizeof buf)
    return fail(Errc::invalid_argument, "/proc/", m_pid, "/", name, ": link longer than expected");
  return std::string(buf, static_cast<size_t>(n));
}

Result<Fd> ProcessDir::root() const {
  // Follows the magic link "root" on purpose: it is the process's root, wherever that is.
  int fd = ::openat(m_dir.fd, "root", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail_errno("open", cat("/proc/", m_pid, "/root"));
  return Fd(fd);
}

}  // namespace gpufence
