// libFuzzer target: the CDI reader (parse_cdi_spec over JSON or YAML), then validation and both
// writers. Oracle: what gpufence writes it reads back as the same spec (the shim reads the
// files `gpufence cdi generate` writes).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "cdi/spec.hpp"

using namespace gpufence;
using Json = nlohmann::ordered_json;

namespace {

// CDI specs are JSON or YAML, both Unicode text without control characters (YAML 1.2
// c-printable); yaml-cpp reads invalid UTF-8 and C0 controls anyway and writes them back as
// U+FFFD, so the round trip is only promised for printable UTF-8 (docs/fuzzing.md).
bool is_printable_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return false;
    if (c == 0x7F) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = parse_cdi_spec(text, "fuzz.yaml");
  if (!spec) return 0;
  (void)validate_cdi_spec(*spec);
  (void)minimum_cdi_version(*spec);

  if (!is_printable_utf8(text)) return 0;
  const auto json = cdi_spec_to_json(*spec);
  const std::string yaml = cdi_spec_to_yaml(*spec);
  auto reread = parse_cdi_spec(yaml, "fuzz-roundtrip.yaml");
  if (!reread) {  // we wrote a spec we cannot read
    std::fprintf(stderr, "written YAML does not read back: %s\n--- YAML:\n%s\n",
                 reread.error().message.c_str(), yaml.c_str());
    std::abort();
  }
  if (const auto again = cdi_spec_to_json(*reread); again != json) {  // it changed on the way
    std::fprintf(stderr,
                 "spec changed on a YAML round trip:\n%s\n--- written:\n%s\n--- read back:\n%s\n",
                 json.dump(-1, ' ', true, Json::error_handler_t::replace).c_str(), yaml.c_str(),
                 again.dump(-1, ' ', true, Json::error_handler_t::replace).c_str());
    std::abort();
  }
  return 0;
}
