// libFuzzer target: /etc/ld.so.cache as bytes (both the new and the old-in-front layouts).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cdi/ldcache.hpp"

using namespace gpufence;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)parse_ld_so_cache(bytes, true);
  (void)parse_ld_so_cache(bytes, false);
  return 0;
}
