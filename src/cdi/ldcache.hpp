// glibc's /etc/ld.so.cache, read without running ldconfig: which file each library name maps to.
// Format (glibc sysdeps/generic/dl-cache.h): the "glibc-ld.so.cache1.1" header (48 bytes: magic,
// version, nlibs, len_strings, flags, extension offset), then nlibs 24-byte entries {int32 flags;
// uint32 key, value; uint32 osversion; uint64 hwcap}, key and value being offsets of NUL-ended
// strings from the start of that header. Older files put an "ld.so-1.7.0" table (12-byte
// entries) in front; the new table then follows it, 8-byte aligned.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct LdCacheEntry {
  std::string name;  // "libcuda.so.1"
  std::string path;  // "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
  int flags = 0;
};

// All entries; `x86_64_only` keeps the 64-bit x86 libraries (FLAG_X8664_LIB64).
Result<std::vector<LdCacheEntry>> parse_ld_so_cache(std::string_view bytes,
                                                    bool x86_64_only = true);

}  // namespace gpufence
