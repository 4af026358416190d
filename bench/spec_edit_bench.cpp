// The shim's spec edit alone, in-process, on a 200-entry config.json: a privileged container as
// containerd's CRI writes it (every host device listed: 200 entries, GPUs among them), allocated
// GPU 1 of 8 by mount marker, its device rules rewritten as a whitelist.
#include <benchmark/benchmark.h>

#include <string>

#include "runtime/allocation.hpp"
#include "runtime/isolation.hpp"

using namespace gpufence;

namespace {

std::string make_spec() {
  Json spec;
  spec["ociVersion"] = "1.1.0";
  spec["process"]["env"] = Json::array({"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"});
  spec["process"]["capabilities"]["bounding"] = Json::array({"CAP_CHOWN", "CAP_SYS_ADMIN"});
  spec["mounts"] = Json::array();
  spec["mounts"].push_back({{"destination", "/var/run/nvidia-container-devices/GPU-1"},
                            {"type", "bind"},
                            {"source", "/dev/null"},
                            {"options", {"rbind", "ro"}}});
  Json devices = Json::array();
  for (unsigned i = 0; i < 8; ++i) {
    devices.push_back(
        {{"path", "/dev/nvidia" + std::to_string(i)}, {"type", "c"}, {"major", 195}, {"minor", i}});
  }
  for (unsigned i = 0; devices.size() < 200; ++i) {
    devices.push_back(
        {{"path", "/dev/tty" + std::to_string(i)}, {"type", "c"}, {"major", 4}, {"minor", i}});
  }
  spec["linux"]["devices"] = devices;
  spec["linux"]["resources"]["devices"] = Json::array({{{"allow", true}, {"access", "rwm"}}});
  return spec.dump();
}

IsolationPlan plan() {
  IsolationPlan p;
  p.grant = {{"/dev/nvidia1", 195, 1}, {"/dev/nvidiactl", 195, 255}};
  // A typical host's registered character majors (/proc/devices).
  p.host_majors.character = {1,   4,   5,   7,   10,  13,  29,  89,  108, 128, 136, 180,
                             189, 195, 226, 234, 235, 236, 237, 238, 239, 240, 241, 242,
                             243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254};
  p.host_majors.block = {7, 8, 9, 11, 65, 66, 128, 253, 254, 259};
  p.reserved_majors = {195, 226, 235, 236};
  p.uuids = {"GPU-1"};
  return p;
}

// Parse, find the request, edit, serialise: everything the shim does between read and write.
void BM_SpecEdit200(benchmark::State& state) {
  const std::string text = make_spec();
  const RuntimeConfig cfg;
  const IsolationPlan p = plan();
  for (auto _ : state) {
    Json spec = Json::parse(text);
    auto ok = check_spec_fields(spec);
    auto req = read_allocation_channels(spec, cfg, admits_all_devices(spec));
    auto r = isolate_spec(spec, p);
    std::string out = spec.dump();
    benchmark::DoNotOptimize(ok);
    benchmark::DoNotOptimize(req);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(out);
  }
  state.SetLabel(std::to_string(text.size()) + " bytes");
}
BENCHMARK(BM_SpecEdit200)->Unit(benchmark::kMicrosecond);

void BM_IsolateOnly200(benchmark::State& state) {
  const Json parsed = Json::parse(make_spec());
  const IsolationPlan p = plan();
  for (auto _ : state) {
    Json spec = parsed;
    auto r = isolate_spec(spec, p);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_IsolateOnly200)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
