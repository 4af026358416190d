// The device plugin's pure parts: preferred allocation, the Allocate answer, health, options.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstring>

#include "deviceplugin/allocate.hpp"
#include "deviceplugin/health.hpp"
#include "deviceplugin/options.hpp"
#include "deviceplugin/preferred.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

// 8 GPUs: 0-1 and 2-3 NVLinked pairs (2-3 with more links), 0-3 under one host bridge, 4-7 under
// another on NUMA node 1.
int score8(const std::string& a, const std::string& b) {
  auto pair = [&](const char* x, const char* y) {
    return (a == x && b == y) || (a == y && b == x);
  };
  if (pair("0", "1")) return 1020;
  if (pair("2", "3")) return 1040;
  int ia = std::stoi(a), ib = std::stoi(b);
  if ((ia < 4) == (ib < 4)) return 600;
  return 0;
}

Gpu gpu(unsigned i) {
  Gpu g;
  g.index = i;
  g.minor = i;
  g.uuid = "GPU-" + std::to_string(i) + "aaa";
  return g;
}

}  // namespace

TEST(Preferred, PicksTheBestConnectedSet) {
  std::vector<std::string> all = {"0", "1", "2", "3", "4", "5", "6", "7"};
  EXPECT_EQ(preferred_allocation(all, {}, 2, score8).value(), (std::vector<std::string>{"2", "3"}));
  auto four = preferred_allocation(all, {}, 4, score8).value();
  std::sort(four.begin(), four.end());
  EXPECT_EQ(four, (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(preferred_allocation(all, {"0"}, 2, score8).value(),
            (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(preferred_allocation({"0", "2", "4"}, {"4"}, 2, score8).value().front(), "4");
  EXPECT_EQ(preferred_allocation({"5", "6"}, {}, 1, score8).value(),
            (std::vector<std::string>{"5"}));
}

TEST(Preferred, HonoursMustIncludeEvenWhenPoorlyConnected) {
  auto r = preferred_allocation({"0", "1", "2", "3", "4"}, {"4", "0"}, 3, score8).value();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], "4");
  EXPECT_EQ(r[1], "0");
  EXPECT_EQ(r[2], "1");
}

TEST(Preferred, RejectsImpossibleRequests) {
  EXPECT_FALSE(preferred_allocation({"0", "1"}, {}, 3, score8));
  EXPECT_FALSE(preferred_allocation({"0", "1"}, {}, 0, score8));
  auto missing = preferred_allocation({"0", "1"}, {"9"}, 1, score8);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("'9'"), std::string::npos);
  EXPECT_FALSE(preferred_allocation({"0", "1", "2"}, {"0", "1"}, 1, score8));
}

TEST(Allocate, ValidatesEveryIdAndNamesTheBadOne) {
  std::vector<PluginDevice> devices = {{"GPU-0aaa", gpu(0)}, {"GPU-1aaa", gpu(1)}};
  auto healthy = [](const std::string& uuid) { return uuid != "GPU-1aaa"; };
  EXPECT_EQ(validate_allocation({"GPU-0aaa"}, devices, healthy).value().size(), 1u);
  auto unknown = validate_allocation({"GPU-0aaa", "GPU-nope"}, devices, healthy);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().message, "unknown device 'GPU-nope'");
  auto sick = validate_allocation({"GPU-1aaa"}, devices, healthy);
  ASSERT_FALSE(sick);
  EXPECT_EQ(sick.error().message, "device 'GPU-1aaa' is Unhealthy");
  EXPECT_FALSE(validate_allocation({"GPU-0aaa", "GPU-0aaa"}, devices, healthy));
  EXPECT_FALSE(validate_allocation({}, devices, healthy));
}

TEST(Allocate, DefaultStrategiesCarryTheAllocationThreeWays) {
  PluginOptions opt;
  std::vector<HostNode> control = {{"/dev/nvidiactl", "/dev/nvidiactl"}};
  auto resp = build_allocate_response({gpu(1)}, opt, control);
  ASSERT_EQ(resp.devices_size(), 2);
  EXPECT_EQ(resp.devices(0).container_path(), "/dev/nvidia1");
  EXPECT_EQ(resp.devices(0).host_path(), "/dev/nvidia1") << "a host path, whatever --host-root";
  EXPECT_EQ(resp.devices(0).permissions(), "rw");
  EXPECT_EQ(resp.devices(1).container_path(), "/dev/nvidiactl");
  ASSERT_EQ(resp.mounts_size(), 1);
  EXPECT_EQ(resp.mounts(0).container_path(), "/var/run/nvidia-container-devices/GPU-1aaa");
  EXPECT_EQ(resp.mounts(0).host_path(), "/dev/null");
  EXPECT_TRUE(resp.mounts(0).read_only());
  EXPECT_EQ(resp.envs().at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  EXPECT_EQ(resp.envs().at("CUDA_VISIBLE_DEVICES"), "GPU-1aaa");
  ASSERT_EQ(resp.annotations_size(), 1);
  EXPECT_EQ(resp.annotations().at("cdi.k8s.io/gpufence_GPU-1aaa"), "gpufence.io/gpu=GPU-1aaa");
  EXPECT_EQ(resp.cdi_devices_size(), 0);
}

TEST(Allocate, ControlNodesAreFoundUnderTheRootAndNamedByTheirHostPaths) {
  test::TempDir root;
  std::filesystem::create_directories(root / "dev");
  if (::mknod((root / "dev/nvidiactl").c_str(), S_IFCHR | 0666, makedev(195, 255)) != 0)
    GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  root.write("dev/nvidia-uvm", "a regular file is not a device node");
  auto nodes = present_control_nodes(HostFs(root.path()));
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].container_path, "/dev/nvidiactl");
  EXPECT_EQ(nodes[0].host_path, "/dev/nvidiactl") << "not " << (root / "dev/nvidiactl");
}

TEST(Allocate, EachStrategyAlone) {
  auto with = [](std::string_view list, bool cuda = true) {
    PluginOptions opt;
    opt.list_strategies = parse_list_strategies(list).value();
    opt.set_cuda_visible_devices = cuda;
    return build_allocate_response({gpu(0), gpu(1)}, opt, {});
  };
  auto cri = with("cdi-cri");
  ASSERT_EQ(cri.cdi_devices_size(), 2);
  EXPECT_EQ(cri.cdi_devices(1).name(), "gpufence.io/gpu=GPU-1aaa");
  EXPECT_EQ(cri.devices_size(), 0);
  EXPECT_EQ(cri.mounts_size(), 0);
  auto env = with("envvar", false);
  EXPECT_EQ(env.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-0aaa,GPU-1aaa");
  EXPECT_FALSE(env.envs().contains("CUDA_VISIBLE_DEVICES"));
  auto specs = with("device-specs");
  EXPECT_EQ(specs.devices_size(), 2);
  EXPECT_FALSE(specs.envs().contains("NVIDIA_VISIBLE_DEVICES"));
  auto ann = with("cdi-annotations");
  EXPECT_EQ(ann.annotations().begin()->second, "gpufence.io/gpu=GPU-0aaa,gpufence.io/gpu=GPU-1aaa");
}

TEST(Health, CriticalXidMarksUnhealthyApplicationXidsDoNot) {
  HealthTracker t({"GPU-a", "GPU-b"}, HealthOptions{});
  auto alive = [](const std::string&) -> Status { return {}; };
  auto now = std::chrono::steady_clock::now();
  for (std::uint64_t xid : {13, 31, 43, 45, 68, 109})
    EXPECT_FALSE(t.on_event({"GPU-a", xid, false}, now, alive));
  EXPECT_TRUE(t.healthy("GPU-a"));
  EXPECT_TRUE(t.on_event({"GPU-a", 48, false}, now, alive));
  EXPECT_FALSE(t.healthy("GPU-a"));
  EXPECT_EQ(t.reason("GPU-a"), "xid 48");
  EXPECT_TRUE(t.healthy("GPU-b"));
  EXPECT_FALSE(t.on_tick(now + 24h, alive)) << "no recovery by default, as NVIDIA's plugin";
}

TEST(Health, RecoveryAfterQuietPeriod) {
  HealthOptions opt;
  opt.recovery = 10s;
  HealthTracker t({"GPU-a"}, opt);
  auto alive = [](const std::string&) -> Status { return {}; };
  auto t0 = std::chrono::steady_clock::now();
  // 48 (double-bit ECC) recovers after the quiet period; 79 (fallen off the bus) never does
  // (HealthPolicy.Xid79StaysUnhealthyWhateverTheRecoveryTime).
  t.on_event({"GPU-a", 48, false}, t0, alive);
  EXPECT_FALSE(t.on_tick(t0 + 5s, alive));
  t.on_event({"GPU-a", 48, false}, t0 + 6s, alive);  // a new critical event restarts the clock
  EXPECT_FALSE(t.on_tick(t0 + 12s, alive));
  EXPECT_TRUE(t.on_tick(t0 + 16s, alive));
  EXPECT_TRUE(t.healthy("GPU-a"));
}

TEST(Health, LostGpuRecoversWhenItAnswersAgain) {
  HealthTracker t({"GPU-a", "GPU-b"}, HealthOptions{});
  bool b_alive = false;
  auto alive = [&](const std::string& u) -> Status {
    if (u == "GPU-a" || b_alive) return {};
    return fail(Errc::nvml, "nvmlDeviceGetUUID ", u, ": GPU is lost (NVML error 15)");
  };
  auto now = std::chrono::steady_clock::now();
  EXPECT_TRUE(t.on_event({"", 79, true}, now, alive));
  EXPECT_TRUE(t.healthy("GPU-a"));
  EXPECT_FALSE(t.healthy("GPU-b"));
  EXPECT_EQ(t.reason("GPU-b"), "lost: nvmlDeviceGetUUID GPU-b: GPU is lost (NVML error 15)");
  EXPECT_EQ(t.lost(), (std::vector<std::string>{"GPU-b"}));
  EXPECT_FALSE(t.on_tick(now, alive));
  b_alive = true;
  EXPECT_TRUE(t.on_tick(now, alive));
  EXPECT_TRUE(t.healthy("GPU-b"));
}

TEST(Health, UnattributedXidAndDisabledChecks) {
  HealthTracker t({"GPU-a", "GPU-b"}, HealthOptions{});
  auto alive = [](const std::string&) -> Status { return {}; };
  auto now = std::chrono::steady_clock::now();
  EXPECT_TRUE(t.on_event({"", 62, false}, now, alive));
  EXPECT_FALSE(t.healthy("GPU-a"));
  EXPECT_FALSE(t.healthy("GPU-b"));
  HealthOptions off;
  off.enabled = false;
  HealthTracker d({"GPU-a"}, off);
  EXPECT_FALSE(d.on_event({"GPU-a", 79, false}, now, alive));
  EXPECT_TRUE(d.healthy("GPU-a"));
}

TEST(Options, Parsing) {
  EXPECT_EQ(parse_list_strategies("device-specs, envvar").value().size(), 2u);
  auto bad = parse_list_strategies("device-specs,volumes");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("'volumes'"), std::string::npos);
  EXPECT_EQ(parse_id_strategy("index").value(), DeviceIdStrategy::index);
  EXPECT_FALSE(parse_id_strategy("serial"));
  EXPECT_EQ(parse_xid_list("48, 79").value(), (std::set<std::uint64_t>{48, 79}));
  EXPECT_FALSE(parse_xid_list("48,x"));
  EXPECT_EQ(parse_duration("10m").value(), std::optional<std::chrono::milliseconds>(600000ms));
  EXPECT_EQ(parse_duration("1500ms").value(), std::optional<std::chrono::milliseconds>(1500ms));
  EXPECT_FALSE(parse_duration("off").value().has_value());
  EXPECT_EQ(parse_duration("10").value(), std::optional<std::chrono::milliseconds>(10000ms))
      << "bare number: seconds";
  EXPECT_FALSE(parse_duration("10d"));
  EXPECT_FALSE(parse_duration("ten"));
}
