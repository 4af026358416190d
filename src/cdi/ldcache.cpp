#include "cdi/ldcache.hpp"

#include <cstdint>
#include <cstring>

namespace gpufence {
namespace {

constexpr std::string_view kOldMagic = "ld.so-1.7.0";
constexpr std::string_view kNewMagic = "glibc-ld.so.cache1.1";
constexpr size_t kNewHeaderSize = 48;
constexpr size_t kNewEntrySize = 24;
constexpr size_t kOldHeaderSize = 16;  // 11-byte magic, padding, uint32 nlibs
constexpr size_t kOldEntrySize = 12;
constexpr int kFlagRequiredMask = 0xff00;
constexpr int kFlagX8664Lib64 = 0x0300;

template <class T>
T read_at(std::string_view bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

}  // namespace

Result<std::vector<LdCacheEntry>> parse_ld_so_cache(std::string_view bytes, bool x86_64_only) {
  size_t start = 0;
  if (bytes.starts_with(kOldMagic)) {
    if (bytes.size() < kOldHeaderSize)
      return fail(Errc::parse, "ld.so.cache: truncated old header");
    uint32_t old_n = read_at<uint32_t>(bytes, 12);
    start = kOldHeaderSize + static_cast<size_t>(old_n) * kOldEntrySize;
    start = (start + 7) & ~static_cast<size_t>(7);
    if (start > bytes.size()) return fail(Errc::parse, "ld.so.cache: old table runs past the end");
  }
  std::string_view cache = bytes.substr(start);
  if (!cache.starts_with(kNewMagic)) {
    return fail(Errc::parse,
                "ld.so.cache: no \"glibc-ld.so.cache1.1\" table (not a glibc 2.x cache?)");
  }
  if (cache.size() < kNewHeaderSize) return fail(Errc::parse, "ld.so.cache: truncated header");
  uint32_t nlibs = read_at<uint32_t>(cache, 20);
  if (nlibs > (cache.size() - kNewHeaderSize) / kNewEntrySize) {
    return fail(Errc::parse, "ld.so.cache: ", nlibs, " entries do not fit in ", cache.size(),
                " bytes");
  }
  auto string_at = [&](uint32_t offset) -> Result<std::string> {
    if (offset >= cache.size())
      return fail(Errc::parse, "ld.so.cache: string offset ", offset, " out of range");
    size_t end = cache.find('\0', offset);
    if (end == std::string_view::npos)
      return fail(Errc::parse, "ld.so.cache: unterminated string at ", offset);
    return std::string(cache.substr(offset, end - offset));
  };
  std::vector<LdCacheEntry> out;
  out.reserve(nlibs);
  for (uint32_t i = 0; i < nlibs; ++i) {
    size_t at = kNewHeaderSize + static_cast<size_t>(i) * kNewEntrySize;
    int32_t flags = read_at<int32_t>(cache, at);
    if (x86_64_only && (flags & kFlagRequiredMask) != kFlagX8664Lib64) continue;
    auto key = string_at(read_at<uint32_t>(cache, at + 4));
    if (!key) return std::unexpected(key.error());
    auto value = string_at(read_at<uint32_t>(cache, at + 8));
    if (!value) return std::unexpected(value.error());
    out.push_back({std::move(*key), std::move(*value), flags});
  }
  return out;
}

}  // namespace gpufence
