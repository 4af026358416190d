#include "runtime/mount_table.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/vfs.h>

#include "common/file.hpp"
#include "runtime/mount_guard.hpp"

namespace gpufence {

namespace {
constexpr const char* kMountInfo = "/proc/self/mountinfo";
}  // namespace

Result<std::vector<std::string>> read_cgroup_mount_points() {
  auto mountinfo = read_file(kMountInfo);
  if (!mountinfo) return std::unexpected(mountinfo.error());
  return cgroup_mount_points(*mountinfo);
}

bool CgroupMountPoints::changed() {
  if (m_watch.fd < 0) return true;
  pollfd p{m_watch.fd, POLLPRI, 0};
  // Polling consumes the event (mounts_poll records the namespace's event count), so a change is
  // reported once; one made after this poll is reported by the next.
  int n = ::poll(&p, 1, 0);
  return n != 0 || (p.revents & (POLLPRI | POLLERR | POLLNVAL)) != 0;
}

// Renaming a directory above a mount point moves the mount without any mount or unmount, so no
// POLLPRI comes: each kept point must still be a cgroup filesystem where it was, or the table is
// read again.
bool CgroupMountPoints::moved() const {
  for (const auto& p : m_points) {
    struct statfs fs {};
    if (::statfs(p.c_str(), &fs) != 0) return true;
    if (fs.f_type != CGROUP_SUPER_MAGIC && fs.f_type != CGROUP2_SUPER_MAGIC) return true;
  }
  return false;
}

Result<std::vector<std::string>> CgroupMountPoints::get() {
  std::lock_guard lock(m_mutex);
  if (m_valid && !changed() && !moved()) return m_points;
  // Opened before the read: a mount made between the two is reported by the next poll.
  if (m_watch.fd < 0) m_watch = Fd(::open(kMountInfo, O_RDONLY | O_CLOEXEC));
  ++m_reads;
  auto points = read_cgroup_mount_points();
  if (!points) {
    m_valid = false;
    return std::unexpected(points.error());
  }
  m_points = *points;
  m_valid = m_watch.fd >= 0;  // without the watch every call reads
  return m_points;
}

}  // namespace gpufence
