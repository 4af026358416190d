#include "common/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>

#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/utc_time.hpp"

namespace gpufence {

Result<LogLevel> parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn" || name == "warning") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  if (name == "off") return LogLevel::off;
  return fail(Errc::invalid_argument, "unknown log level '", name,
              "' (expected debug, info, warn, error or off)");
}

Logger::Logger(LogLevel level) : m_level(level) {}

Logger::~Logger() {
  if (m_owns_sink) std::fclose(m_sink);
}

Status Logger::open_file(const std::string& path) {
  // Root appends here on every container create: no symlink anywhere in the path, and only a
  // regular file with one link of our own (common/file.hpp, docs/trust-model.md).
  auto fd = open_append_checked(path, Symlinks::none, 0600, MakeDir::yes);
  if (!fd) return std::unexpected(fd.error().wrap("log file"));
  std::FILE* f = ::fdopen(fd->fd, "a");
  if (!f) return fail_errno("fdopen log file", path);
  fd->fd = -1;  // the FILE owns it now
  std::lock_guard lock(m_mutex);
  if (m_owns_sink) std::fclose(m_sink);
  m_sink = f;
  m_owns_sink = true;
  return {};
}

void Logger::log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (!enabled(level)) return;
  static constexpr const char* names[] = {"debug", "info", "warn", "error"};
  const std::string stamp = utc_rfc3339(std::chrono::system_clock::now(), SubSecond::millis);
  std::string line = cat(stamp, " level=", names[static_cast<int>(level)], " event=", event);
  // Each value at most kMaxLogValueBytes of input: a field carrying pod bytes no caller cut
  // cannot make one line megabytes long (a log on the path every container waits on).
  for (const auto& [key, value] : fields) {
    std::string_view v = value;
    const bool cut = v.size() > kMaxLogValueBytes;
    if (cut) v = v.substr(0, kMaxLogValueBytes);
    line += cat(" ", key, "=", log_value(v));
    if (cut) line += cat("...(", value.size(), "_bytes)");
  }
  line += '\n';
  std::lock_guard lock(m_mutex);
  std::fwrite(line.data(), 1, line.size(), m_sink);
  std::fflush(m_sink);
}

}  // namespace gpufence
