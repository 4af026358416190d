// libFuzzer target: the shim's spec edit, end to end as prepare_bundle runs it on config.json:
// parse -> check_spec_fields -> read_allocation_channels -> decide_allocation -> isolate_spec ->
// serialise. Input: one byte of runtime config (bit 0: trust NVIDIA_VISIBLE_DEVICES, bit 1:
// [allocation] privileged = "passthrough"), then the config.json text. The host has GPUs at minors
// 0-3.
//
// Oracle: when isolate_spec succeeds, the written device rules (read as runc applies them, the
// doctor's openable_gpu_minors_from_oci_rules) open no GPU minor beyond those granted, including
// minors the host does not have yet.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "doctor/parse.hpp"
#include "runtime/allocation.hpp"
#include "runtime/isolation.hpp"

using namespace gpufence;

namespace {

std::vector<Gpu> make_inventory() {
  std::vector<Gpu> gpus(4);
  for (unsigned i = 0; i < gpus.size(); ++i) {
    gpus[i].index = i;
    gpus[i].minor = i;
    gpus[i].uuid =
        "GPU-" + std::to_string(i) + "aaaaaaa-0000-0000-0000-00000000000" + std::to_string(i);
  }
  return gpus;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Gpu> inventory = make_inventory();
  if (size < 1) return 0;
  RuntimeConfig cfg;
  if (data[0] & 1) cfg.trusted_channels.push_back(Channel::envvar);
  if (data[0] & 2) cfg.all_devices_policy = AllDevicesPolicy::passthrough;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  // Parse as the shim does; a malformed config.json is refused before anything else.
  Json spec = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded() || !spec.is_object()) return 0;
  if (!check_spec_fields(spec)) return 0;

  const bool admits_all = admits_all_devices(spec);
  auto channels = read_allocation_channels(spec, cfg, admits_all);
  if (!channels) return 0;
  if (channels->empty() && admits_all && cfg.all_devices_policy == AllDevicesPolicy::passthrough)
    return 0;
  auto allocation = decide_allocation(*channels, inventory);
  if (!allocation) return 0;

  IsolationPlan plan;
  std::set<unsigned> granted_minors;
  for (const auto& gpu : allocation->granted) {
    plan.grant.push_back({"/dev/nvidia" + std::to_string(gpu.minor), kNvidiaMajor, gpu.minor});
    plan.uuids.push_back(gpu.uuid);
    granted_minors.insert(gpu.minor);
  }
  if (!allocation->granted.empty()) plan.grant.push_back({"/dev/nvidiactl", kNvidiaMajor, 255});
  plan.host_majors.character = {1, 4, 5, 10, 136, 195, 226, 511};
  plan.host_majors.block = {7, 8};
  plan.reserved_majors = {195, 226, 511};
  plan.explicit_none =
      get_env(spec, "NVIDIA_VISIBLE_DEVICES") == std::optional<std::string>("none");

  auto result = isolate_spec(spec, plan);
  if (!result) return 0;
  const std::string out = spec.dump();

  std::set<unsigned> minors = {0, 1, 2, 3, 7, 253};  // the host's GPUs and ones created later
  for (unsigned m : openable_gpu_minors_from_oci_rules(out, minors)) {
    if (!granted_minors.contains(m)) {  // an unallocated GPU stays open
      std::fprintf(stderr, "minor %u is openable but not granted in:\n%s\n", m, out.c_str());
      std::abort();
    }
  }
  return 0;
}
