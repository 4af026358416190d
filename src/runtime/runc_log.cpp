#include "runtime/runc_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/file.hpp"
#include "common/utc_time.hpp"

namespace gpufence {
namespace {

// RFC 3339 in UTC with nanoseconds, as logrus writes it (time.RFC3339Nano, but with the fixed
// nine digits runc's own lines have had; containerd parses either).
std::string rfc3339(std::chrono::system_clock::time_point when) {
  return utc_rfc3339(when, SubSecond::nanos);
}

}  // namespace

std::string runc_log_line(std::string_view format, std::string_view level, std::string_view msg,
                          std::chrono::system_clock::time_point when) {
  if (format == "json") {
    nlohmann::ordered_json line;
    line["level"] = level;
    line["msg"] = msg;
    line["time"] = rfc3339(when);
    return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  std::string quoted = nlohmann::json(std::string(msg))
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return "time=\"" + rfc3339(when) + "\" level=" + std::string(level) + " msg=" + quoted + "\n";
}

Status append_runc_log(const std::string& path, const std::string& line) {
  // containerd's own directory, named on our command line: the last component is never followed
  // and only a regular file with one link of our own is appended to.
  auto fd = open_append_checked(path, Symlinks::in_parent_only, 0644);
  if (!fd) return std::unexpected(fd.error().wrap("runtime log"));
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd->fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail_errno("write runtime log", path);
    done += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace gpufence
