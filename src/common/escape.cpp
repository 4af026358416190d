#include "common/escape.hpp"

#include <algorithm>
#include <cstdint>

namespace gpufence {
namespace {

void append_hex(std::string& out, unsigned char b) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[b >> 4];
  out += kHex[b & 0xf];
}

// The length of the well-formed UTF-8 sequence at in[i] that is not a C1 control, else 0.
size_t utf8_sequence(std::string_view in, size_t i) {
  auto b = static_cast<unsigned char>(in[i]);
  size_t len = b >= 0xf0 && b <= 0xf4   ? 4
               : b >= 0xe0 && b < 0xf0  ? 3
               : b >= 0xc2 && b <= 0xdf ? 2
                                        : 0;
  if (len == 0 || i + len > in.size()) return 0;
  uint32_t cp = len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
  for (size_t k = 1; k < len; ++k) {
    auto c = static_cast<unsigned char>(in[i + k]);
    if ((c & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3f);
  }
  // No overlong form, no surrogate, at most U+10FFFF; U+0080..U+009F are C1 controls.
  bool ok = (len == 2 && cp >= 0xa0) || (len == 3 && cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) ||
            (len == 4 && cp >= 0x10000 && cp <= 0x10ffff);
  return ok ? len : 0;
}

// The one escaping loop: stops once the output holds `limit` bytes and returns how many input
// bytes it consumed.
size_t escape_into(std::string& out, std::string_view in, std::string_view also, bool backslash,
                   size_t limit) {
  size_t i = 0;
  while (i < in.size() && out.size() < limit) {
    auto b = static_cast<unsigned char>(in[i]);
    if (b == '\\') {
      out += backslash ? "\\\\" : "\\";
      ++i;
    } else if (b < 0x80) {
      if (b < 0x20 || b == 0x7f || also.find(static_cast<char>(b)) != std::string_view::npos)
        append_hex(out, b);
      else
        out += static_cast<char>(b);
      ++i;
    } else if (size_t len = utf8_sequence(in, i); len != 0) {
      out.append(in.substr(i, len));
      i += len;
    } else {
      append_hex(out, b);
      ++i;
    }
  }
  return i;
}

std::string bounded(std::string_view in, size_t max_bytes, std::string_view also, bool backslash) {
  std::string out;
  out.reserve(std::min(in.size(), max_bytes) + 32);
  size_t used = escape_into(out, in, also, backslash, max_bytes);
  if (used < in.size()) out += "...(" + std::to_string(in.size()) + " bytes)";
  return out;
}

}  // namespace

std::string escape_text(std::string_view in, std::string_view also) {
  std::string out;
  out.reserve(in.size());
  escape_into(out, in, also, true, std::string::npos);
  return out;
}

std::string escape_excerpt(std::string_view in, size_t max_bytes, std::string_view also) {
  return bounded(in, max_bytes, also, true);
}

std::string bounded_line(std::string_view escaped, size_t max_bytes) {
  return bounded(escaped, max_bytes, {}, false);
}

std::string log_value(std::string_view value) {
  std::string out = escape_text(value, "\"'$`;&|<>");
  if (out.empty() || out.find_first_of(" =#") != std::string::npos) return "\"" + out + "\"";
  return out;
}

}  // namespace gpufence
