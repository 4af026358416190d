// libFuzzer target: the shim's spec edit through the real steps prepare_bundle runs on
// config.json: parse_spec, then edit_spec (channels, allocation, CDI selection, the host's device
// facts, plan_isolation, isolate_spec, hooks), then serialise. Only the outside world is a table:
// the host has GPUs at minors 0-3 (nodes, /proc/devices, DRM cards), NVML lists them, no CDI spec
// directory exists. Input: one byte of runtime config (bit 0: trust NVIDIA_VISIBLE_DEVICES,
// bit 1: [allocation] privileged = "passthrough"), then the config.json text.
//
// Oracle: when the edit succeeds, the written device rules (read as runc applies them, the
// doctor's openable_gpu_minors_from_oci_rules) open no GPU minor beyond those granted, including
// minors the host does not have yet.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "doctor/parse.hpp"
#include "runtime/shim.hpp"

using namespace gpufence;

namespace {

constexpr unsigned kGpus = 4;

std::string uuid_of(unsigned i) {
  return "GPU-" + std::to_string(i) + "aaaaaaa-0000-0000-0000-00000000000" + std::to_string(i);
}

class Inventory : public GpuInventory {
 public:
  Result<std::vector<Gpu>> gpus() override {
    std::vector<Gpu> out(kGpus);
    for (unsigned i = 0; i < kGpus; ++i) {
      out[i].index = i;
      out[i].minor = i;
      out[i].uuid = uuid_of(i);
      out[i].pci_bus_id = "00000000:0" + std::to_string(i + 1) + ":00.0";
    }
    return out;
  }
  Result<std::vector<GpuProcess>> processes(const std::string&) override {
    return std::vector<GpuProcess>{};
  }
  Result<Topology> topology(const std::string&, const std::string&) override { return Topology{}; }
  Status check_alive(const std::string&) override { return {}; }
  Result<std::optional<GpuEvent>> wait_event(std::chrono::milliseconds) override {
    return std::optional<GpuEvent>{};
  }
};

// The host, as read_host_device_facts reports it: only what the query names.
HostDeviceFacts host_facts(const HostDeviceQuery& query) {
  static const std::map<std::string, DeviceNode> nodes = [] {
    std::map<std::string, DeviceNode> m;
    for (unsigned i = 0; i < kGpus; ++i) {
      std::string path = "/dev/nvidia" + std::to_string(i);
      m[path] = {path, kNvidiaMajor, i};
    }
    m["/dev/nvidiactl"] = {"/dev/nvidiactl", kNvidiaMajor, 255};
    m["/dev/nvidia-uvm"] = {"/dev/nvidia-uvm", 511, 0};
    m["/dev/nvidia-uvm-tools"] = {"/dev/nvidia-uvm-tools", 511, 1};
    return m;
  }();
  HostDeviceFacts facts;
  facts.registered = parse_proc_devices(
      "Character devices:\n  1 mem\n  4 tty\n  5 /dev/tty\n 10 misc\n136 pts\n"
      "195 nvidia-frontend\n226 drm\n510 nvidia-caps\n511 nvidia-uvm\n\n"
      "Block devices:\n  7 loop\n  8 sd\n");
  for (const auto& path : query.char_paths) {
    auto it = nodes.find(path);
    if (it == nodes.end())
      facts.char_nodes.emplace(path, fail(Errc::not_found, path, ": no such node"));
    else
      facts.char_nodes.emplace(path, it->second);
  }
  if (query.drm_nodes) {
    facts.drm_nodes.push_back({"card0", 0, "0000:00:02.0", false});  // another vendor's
    for (unsigned i = 0; i < kGpus; ++i)
      facts.drm_nodes.push_back({"card" + std::to_string(i + 1), i + 1,
                                 "0000:0" + std::to_string(i + 1) + ":00.0", true});
  }
  return facts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Logger log{LogLevel::off};
  if (size < 1) return 0;
  RuntimeConfig cfg;
  cfg.log_file = "";
  cfg.device_root = "/nonexistent-gpufence-fuzz-root";  // no driver procfs: NVML is asked
  cfg.cdi_spec_dirs = {};
  if (data[0] & 1) cfg.trusted_channels.push_back(Channel::envvar);
  if (data[0] & 2) cfg.all_devices_policy = AllDevicesPolicy::passthrough;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  // Parse as the shim does; a malformed config.json is refused before anything else.
  auto spec = parse_spec(text, "config.json");
  if (!spec) return 0;

  ShimContext ctx{cfg,
                  log,
                  []() -> Result<std::unique_ptr<GpuInventory>> {
                    return std::unique_ptr<GpuInventory>(std::make_unique<Inventory>());
                  },
                  "/usr/local/bin/gpufence-runtime",
                  CdiEdits::apply,
                  host_facts};
  ShimDecision decision;
  auto changed = edit_spec(*spec, ctx, decision, "config.json");
  if (!changed || decision.passthrough) return 0;
  const std::string out = spec->dump();

  std::set<unsigned> granted_minors;
  for (unsigned i = 0; i < kGpus; ++i)
    for (const auto& uuid : decision.granted)
      if (uuid == uuid_of(i)) granted_minors.insert(i);
  std::set<unsigned> minors = {0, 1, 2, 3, 7, 253};  // the host's GPUs and ones created later
  for (unsigned m : openable_gpu_minors_from_oci_rules(out, minors)) {
    if (!granted_minors.contains(m)) {  // an unallocated GPU stays open
      std::fprintf(stderr, "minor %u is openable but not granted in:\n%s\n", m, out.c_str());
      std::abort();
    }
  }
  return 0;
}
