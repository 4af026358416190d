// Small string helpers shared by every component.
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpufence {

std::string_view trim(std::string_view s);
std::vector<std::string_view> split(std::string_view s, char sep);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::string to_lower(std::string_view s);
bool starts_with_ci(std::string_view s, std::string_view prefix);
// "0000:3b:00.0" (sysfs, driver procfs) -> "00000000:3B:00.0" (NVML's busId form).
std::string to_upper_hex_bus(std::string_view bus);

// Parses a whole decimal number; nullopt on any stray character, sign or overflow.
template <class T>
std::optional<T> parse_number(std::string_view s) {
  T value{};
  if (s.empty()) return std::nullopt;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

}  // namespace gpufence
