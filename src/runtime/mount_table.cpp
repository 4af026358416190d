#include "runtime/mount_table.hpp"

#include <fcntl.h>
#include <poll.h>

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

Result<std::vector<std::string>> CgroupMountPoints::get() {
  std::lock_guard lock(m_mutex);
  if (m_valid && !changed()) return m_points;
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
