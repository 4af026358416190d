// Structured logging: one line per event, "time level event key=value ...", to stderr or a file.
// A Logger is passed in through the context object of each binary; there is no global logger.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.hpp"

namespace gpufence {

enum class LogLevel { debug, info, warn, error, off };

Result<LogLevel> parse_log_level(std::string_view name);

using LogField = std::pair<std::string_view, std::string>;

// The most of one field's value a log line carries (then "...(N_bytes)").
inline constexpr size_t kMaxLogValueBytes = 16 * 1024;

class Logger {
 public:
  // Logs to stderr.
  explicit Logger(LogLevel level = LogLevel::info);
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Appends to `path`: no symlink in any component, its directory made 0700 if missing, the
  // file created 0600 or taken only as a regular file with one link of our own
  // (open_append_checked). On failure the logger keeps its old sink.
  Status open_file(const std::string& path);
  void set_level(LogLevel level) { m_level = level; }
  bool enabled(LogLevel level) const { return level >= m_level && m_level != LogLevel::off; }

  void log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields = {});
  void debug(std::string_view e, std::initializer_list<LogField> f = {}) {
    log(LogLevel::debug, e, f);
  }
  void info(std::string_view e, std::initializer_list<LogField> f = {}) {
    log(LogLevel::info, e, f);
  }
  void warn(std::string_view e, std::initializer_list<LogField> f = {}) {
    log(LogLevel::warn, e, f);
  }
  void error(std::string_view e, std::initializer_list<LogField> f = {}) {
    log(LogLevel::error, e, f);
  }

 private:
  LogLevel m_level;
  std::FILE* m_sink = stderr;
  bool m_owns_sink = false;
  std::mutex m_mutex;
};

}  // namespace gpufence
