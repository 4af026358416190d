#include "runtime/runc_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <ctime>

#include <nlohmann/json.hpp>

namespace gpufence {
namespace {

// RFC 3339 in UTC with nanoseconds, as logrus writes it.
std::string rfc3339(std::chrono::system_clock::time_point when) {
  auto secs = std::chrono::time_point_cast<std::chrono::seconds>(when);
  auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(when - secs).count();
  std::time_t t = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%09lldZ", static_cast<long long>(nanos));
  return std::string(buf) + frac;
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
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return fail_errno("open runtime log", path);
  ssize_t n = ::write(fd, line.data(), line.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) return fail_errno("write runtime log", path, err);
  return {};
}

}  // namespace gpufence
