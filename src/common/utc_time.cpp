#include "common/utc_time.hpp"

#include <cstdio>
#include <ctime>

namespace gpufence {
namespace {

struct Split {
  std::tm utc{};
  long long nanos = 0;  // within the second, 0..999'999'999
};

// floor, not time_point_cast (which truncates toward zero): a time before 1970 still splits
// into the second it falls in and a non-negative fraction.
Split split(std::chrono::system_clock::time_point t) {
  const auto secs = std::chrono::floor<std::chrono::seconds>(t);
  Split s;
  s.nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(t - secs).count();
  const std::time_t whole = std::chrono::system_clock::to_time_t(secs);
  ::gmtime_r(&whole, &s.utc);
  return s;
}

}  // namespace

std::string utc_rfc3339(std::chrono::system_clock::time_point t, SubSecond digits) {
  const Split s = split(t);
  char buf[64];
  int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d", s.utc.tm_year + 1900,
                        s.utc.tm_mon + 1, s.utc.tm_mday, s.utc.tm_hour, s.utc.tm_min, s.utc.tm_sec);
  std::string out(buf, static_cast<size_t>(n));
  switch (digits) {
    case SubSecond::none:
      break;
    case SubSecond::millis:
      std::snprintf(buf, sizeof buf, ".%03lld", s.nanos / 1'000'000);
      out += buf;
      break;
    case SubSecond::micros:
      std::snprintf(buf, sizeof buf, ".%06lld", s.nanos / 1'000);
      out += buf;
      break;
    case SubSecond::nanos:
      std::snprintf(buf, sizeof buf, ".%09lld", s.nanos);
      out += buf;
      break;
  }
  return out + "Z";
}

std::string utc_compact_stamp(std::chrono::system_clock::time_point t) {
  const Split s = split(t);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d%02d%02dT%02d%02d%02dZ", s.utc.tm_year + 1900,
                s.utc.tm_mon + 1, s.utc.tm_mday, s.utc.tm_hour, s.utc.tm_min, s.utc.tm_sec);
  return buf;
}

std::optional<std::chrono::system_clock::time_point> parse_utc_rfc3339(std::string_view text) {
  if (text.size() < 20 || text.back() != 'Z') return std::nullopt;
  std::string head(text.substr(0, 19));
  std::tm tm{};
  const char* end = ::strptime(head.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  std::string_view rest = text.substr(19, text.size() - 20);
  if (!rest.empty() && (rest.front() != '.' || rest.size() == 1 ||
                        rest.substr(1).find_first_not_of("0123456789") != std::string_view::npos))
    return std::nullopt;
  time_t t = ::timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t);
}

}  // namespace gpufence
