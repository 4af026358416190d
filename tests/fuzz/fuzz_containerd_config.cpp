// libFuzzer target: containerd config.toml as `gpufence check-containerd` and `setup` read it:
// toml++ parse, version, CRI runtimes, imports merged (every import reads back this same text),
// and check_containerd_config's findings.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "containerd/config.hpp"

using namespace gpufence;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = parse_containerd_config(text, "/etc/containerd/config.toml");
  if (!cfg) return 0;

  ContainerdCheckOptions options;
  options.handlers = {"nvidia", "gpufence", "runc"};
  (void)cri_runtimes(*cfg);
  (void)default_runtime_name(*cfg);
  (void)check_containerd_config(*cfg, options);
  options.expect_gpufence = true;
  (void)check_containerd_config(*cfg, options);

  auto merged = merge_imports(
      *cfg, [&](const std::string&) -> Result<std::string> { return text; },
      [](const std::string& pattern) { return std::vector<std::string>{pattern}; });
  if (merged) (void)check_containerd_config(*merged, options);
  return 0;
}
