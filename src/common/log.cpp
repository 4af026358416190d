#include "common/log.hpp"

#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include <ctime>

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
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return fail_errno("open log file", path);
  std::FILE* f = ::fdopen(fd, "a");
  if (!f) {
    ::close(fd);
    return fail_errno("fdopen log file", path);
  }
  std::lock_guard lock(m_mutex);
  if (m_owns_sink) std::fclose(m_sink);
  m_sink = f;
  m_owns_sink = true;
  return {};
}

std::string log_quote(std::string_view value) {
  bool needs = value.empty() || value.find_first_of(" \t\n\"=") != std::string_view::npos;
  if (!needs) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  out += '"';
  return out;
}

void Logger::log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (!enabled(level)) return;
  static constexpr const char* names[] = {"debug", "info", "warn", "error"};
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  tm utc{};
  ::gmtime_r(&tv.tv_sec, &utc);
  char stamp[80];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long>(tv.tv_usec / 1000));
  std::string line = cat(stamp, " level=", names[static_cast<int>(level)], " event=", event);
  for (const auto& [key, value] : fields) line += cat(" ", key, "=", log_quote(value));
  line += '\n';
  std::lock_guard lock(m_mutex);
  std::fwrite(line.data(), 1, line.size(), m_sink);
  std::fflush(m_sink);
}

}  // namespace gpufence
