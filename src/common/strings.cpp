#include "common/strings.hpp"

#include <algorithm>
#include <cctype>

namespace gpufence {

std::string_view trim(std::string_view s) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  return to_lower(s.substr(0, prefix.size())) == to_lower(prefix);
}

std::string to_upper_hex_bus(std::string_view bus) {
  std::string out;
  for (char c : bus) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto colon = out.find(':');
  // Pad the domain to 8 hex digits when the bus id has domain:bus:device.function.
  if (colon != std::string::npos && out.find(':', colon + 1) != std::string::npos && colon < 8) {
    out.insert(0, 8 - colon, '0');
  }
  return out;
}

}  // namespace gpufence
