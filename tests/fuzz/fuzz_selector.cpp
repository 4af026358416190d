// libFuzzer target: device selectors (NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES values, CDI
// names) parsed, then resolved against a fixed inventory. Input: the value, as bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string_view>

#include "gpu/selector.hpp"

using namespace gpufence;

namespace {

std::vector<Gpu> make_inventory() {
  std::vector<Gpu> gpus(3);
  const char* uuids[] = {"GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01",
                         "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2",
                         "GPU-5a1c9999-0000-0000-0000-000000000000"};  // shares a prefix with 0
  for (unsigned i = 0; i < gpus.size(); ++i) {
    gpus[i].index = i;
    gpus[i].minor = i;
    gpus[i].uuid = uuids[i];
  }
  return gpus;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Gpu> inventory = make_inventory();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  (void)parse_device_token(text);
  auto selector = parse_device_selector(text);
  if (!selector) return 0;
  auto gpus = resolve_selector(*selector, inventory);
  if (!gpus) return 0;
  // Contract (selector.hpp): a GPU named twice is an error, so a resolved list has no repeats.
  std::set<std::string> seen;
  for (const auto& gpu : *gpus) {
    if (!seen.insert(gpu.uuid).second) std::abort();
  }
  return 0;
}
