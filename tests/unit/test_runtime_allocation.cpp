// Where an allocation may come from: each channel, forged and genuine, on literal specs.
#include <gtest/gtest.h>

#include "gpu/wire_contract.hpp"
#include "runtime/allocation.hpp"
#include "runtime/mount_guard.hpp"

using namespace gpufence;

namespace {

std::vector<Gpu> two_gpus() {
  Gpu a;
  a.index = 0;
  a.minor = 0;
  a.uuid = "GPU-aaa";
  a.pci_bus_id = "00000000:01:00.0";
  Gpu b = a;
  b.index = 1;
  b.minor = 1;
  b.uuid = "GPU-bbb";
  b.pci_bus_id = "00000000:02:00.0";
  return {a, b};
}

Json spec_with(const char* extra) {
  Json spec = Json::parse(R"({"process": {"env": ["PATH=/bin"]}, "mounts": [], "linux": {}})");
  spec.merge_patch(Json::parse(extra));
  return spec;
}

Json marker(const std::string& id) {
  return Json{{"destination", "/var/run/nvidia-container-devices/" + id},
              {"type", "bind"},
              {"source", "/dev/null"},
              {"options", {"rbind", "ro"}}};
}

Json gpu_device(unsigned minor) {
  return Json{{"path", "/dev/nvidia" + std::to_string(minor)},
              {"type", "c"},
              {"major", 195},
              {"minor", minor}};
}

Result<Allocation> decide(const Json& spec, bool privileged, RuntimeConfig cfg = {}) {
  auto ch = read_allocation_channels(spec, cfg, privileged);
  if (!ch) return std::unexpected(ch.error());
  return decide_allocation(*ch, two_gpus());
}

std::vector<std::string> granted(const Allocation& a) {
  std::vector<std::string> out;
  for (const auto& g : a.granted) out.push_back(g.uuid);
  return out;
}

}  // namespace

TEST(Allocation, TheContainersOwnEnvIsNeverAnAllocation) {
  for (const char* value : {"GPU-bbb", "1", "all", "0,1"}) {
    Json spec = spec_with("{}");
    spec["process"]["env"].push_back(std::string("NVIDIA_VISIBLE_DEVICES=") + value);
    for (bool privileged : {false, true}) {
      auto a = decide(spec, privileged);
      ASSERT_TRUE(a) << a.error().message;
      EXPECT_EQ(a->channel, Channel::none) << value << " privileged=" << privileged;
      EXPECT_TRUE(a->granted.empty());
      ASSERT_EQ(a->ignored.size(), 1u);
      EXPECT_NE(a->ignored[0].find(std::string("NVIDIA_VISIBLE_DEVICES=") + value),
                std::string::npos);
    }
  }
  Json junk = spec_with(R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0:1"]}})");
  EXPECT_TRUE(decide(junk, false)) << "a malformed untrusted value is ignored, not refused";
}

TEST(Allocation, EnvCountsOnlyWithTheOperatorsOptIn) {
  RuntimeConfig cfg;
  cfg.trusted_channels.push_back(Channel::envvar);
  Json spec = spec_with(R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]}})");
  auto a = decide(spec, false, cfg);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->channel, Channel::envvar);
  EXPECT_EQ(granted(*a), (std::vector<std::string>{"GPU-bbb"}));
  Json all = spec_with(R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}})");
  EXPECT_EQ(decide(all, false, cfg)->granted.size(), 2u);
  Json bad = spec_with(R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=7"]}})");
  EXPECT_FALSE(decide(bad, false, cfg)) << "trusted and naming no GPU: refused";
}

TEST(Allocation, APodEnvOverridingThePluginsIsRefusedWhenEnvIsTrusted) {
  // The kubelet's order: the device plugin's env, then the pod's; the last one wins.
  Json spec = spec_with(
      R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-aaa", "NVIDIA_VISIBLE_DEVICES=GPU-bbb\u001b[2J"]}})");
  RuntimeConfig cfg;
  cfg.trusted_channels.push_back(Channel::envvar);
  auto a = decide(spec, false, cfg);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::denied);
  EXPECT_NE(a.error().message.find("values that disagree"), std::string::npos);
  EXPECT_NE(a.error().message.find("GPU-bbb\\x1b[2J"), std::string::npos) << a.error().message;
  EXPECT_EQ(a.error().message.find('\x1b'), std::string::npos);
  // The same value twice is no override.
  Json same = spec_with(
      R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-aaa", "NVIDIA_VISIBLE_DEVICES=GPU-aaa"]}})");
  auto ok = decide(same, false, cfg);
  ASSERT_TRUE(ok);
  EXPECT_EQ(granted(*ok), (std::vector<std::string>{"GPU-aaa"}));
  // A CUDA image's "all" comes before the plugin's value (containerd appends the image's env
  // first): no override, the plugin's value counts.
  Json image_all = spec_with(
      R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-bbb"]}})");
  auto from_image = decide(image_all, false, cfg);
  ASSERT_TRUE(from_image) << from_image.error().message;
  EXPECT_EQ(granted(*from_image), (std::vector<std::string>{"GPU-bbb"}));
  // "all" after the plugin's value is the pod's: refused, image "all" or not.
  for (const char* env : {R"(["NVIDIA_VISIBLE_DEVICES=GPU-bbb", "NVIDIA_VISIBLE_DEVICES=all"])",
                          R"(["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=GPU-bbb",
                              "NVIDIA_VISIBLE_DEVICES=all"])"}) {
    Json pod_all = spec_with("{}");
    pod_all["process"]["env"] = Json::parse(env);
    EXPECT_FALSE(decide(pod_all, false, cfg)) << env;
  }
  // Without the opt-in the env never counts: nothing to refuse, nothing granted.
  auto untrusted = decide(spec, false);
  ASSERT_TRUE(untrusted);
  EXPECT_TRUE(untrusted->granted.empty());
}

TEST(Allocation, RenumberedMinorsNeverGrantAnotherGpu) {
  // The kubelet replays its checkpointed answer after a reboot that swapped the GPUs' minors:
  // the marker (by UUID) names GPU-aaa, the device spec /dev/nvidia1, now GPU-bbb's.
  Json spec = spec_with("{}");
  spec["mounts"].push_back(marker("GPU-aaa"));
  spec["linux"]["devices"] = Json::array({gpu_device(1)});
  auto a = decide(spec, false);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::denied);
  EXPECT_NE(a.error().message.find("/dev/nvidia1 now"), std::string::npos) << a.error().message;
  EXPECT_NE(a.error().message.find("minor numbers changed"), std::string::npos);
  EXPECT_NE(a.error().message.find("delete the pod"), std::string::npos);
  // The same with the CDI annotation naming the UUID.
  Json ann = spec_with("{}");
  ann["annotations"]["cdi.k8s.io/a"] = std::string(kCdiKind) + "=GPU-aaa";
  ann["linux"]["devices"] = Json::array({gpu_device(1)});
  auto b = decide(ann, false);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("delete the pod"), std::string::npos);
}

TEST(Allocation, AMarkerAloneInAnUnprivilegedSpecIsForgeable) {
  Json spec = spec_with("{}");
  spec["mounts"].push_back(marker("GPU-bbb"));
  auto a = decide(spec, false);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->channel, Channel::none);
  EXPECT_TRUE(a->granted.empty());
  ASSERT_EQ(a->ignored.size(), 1u);
  EXPECT_NE(a->ignored[0].find("GPU-bbb"), std::string::npos);
  // In a privileged spec every host GPU is listed anyway: the marker counts there.
  auto p = decide(spec, true);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->channel, Channel::mount_markers);
  EXPECT_EQ(granted(*p), (std::vector<std::string>{"GPU-bbb"}));
}

TEST(Allocation, TheKubeletsDeviceSpecsCorroborateMarkers) {
  Json spec = spec_with("{}");
  spec["mounts"].push_back(marker("GPU-bbb"));
  spec["linux"]["devices"] = Json::array({gpu_device(1)});
  auto a = decide(spec, false);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->channel, Channel::device_specs);
  EXPECT_EQ(granted(*a), (std::vector<std::string>{"GPU-bbb"}));
  EXPECT_TRUE(a->ignored.empty());
  // A marker for another GPU beside the kubelet's device spec: the channels disagree (a
  // renumbered node, or a pod forging a marker, which refuses only itself).
  spec["mounts"].push_back(marker("GPU-aaa"));
  a = decide(spec, false);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::denied);
  // A marker naming no GPU of this node is still only ignored.
  Json unknown = spec_with("{}");
  unknown["mounts"].push_back(marker("GPU-bbb"));
  unknown["mounts"].push_back(marker("GPU-zzz"));
  unknown["linux"]["devices"] = Json::array({gpu_device(1)});
  a = decide(unknown, false);
  ASSERT_TRUE(a);
  EXPECT_EQ(granted(*a), (std::vector<std::string>{"GPU-bbb"}));
  ASSERT_EQ(a->ignored.size(), 1u);
  EXPECT_NE(a->ignored[0].find("GPU-zzz"), std::string::npos);
  // Control nodes in linux.devices are not GPUs.
  Json ctl = spec_with("{}");
  ctl["linux"]["devices"] = Json::parse(
      R"([{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
          {"path": "/dev/nvidia-modeset", "type": "c", "major": 195, "minor": 254}])");
  EXPECT_TRUE(decide(ctl, false)->granted.empty());
}

TEST(Allocation, DeviceSpecsInAPrivilegedSpecAreTheHostsNotAnAllocation) {
  Json spec = spec_with("{}");
  spec["linux"]["devices"] = Json::array({gpu_device(0), gpu_device(1)});
  auto a = decide(spec, true);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->granted.empty());
}

TEST(Allocation, AnnotationsAreTrustedAndMustAgreeWithDeviceSpecs) {
  Json spec = spec_with(
      R"({"annotations": {"cdi.k8s.io/gpufence_GPU-bbb": "nvidia.com/gpu=GPU-bbb,vendor.com/fpga=1",
                          "other/x": "nvidia.com/gpu=GPU-aaa"}})");
  auto a = decide(spec, false);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->channel, Channel::cdi_annotations);
  EXPECT_EQ(granted(*a), (std::vector<std::string>{"GPU-bbb"}));
  spec["linux"]["devices"] = Json::array({gpu_device(1)});
  EXPECT_EQ(granted(*decide(spec, false)), (std::vector<std::string>{"GPU-bbb"}));
  spec["linux"]["devices"] = Json::array({gpu_device(0)});
  auto disagree = decide(spec, false);
  ASSERT_FALSE(disagree);
  EXPECT_EQ(disagree.error().code, Errc::denied);
  EXPECT_NE(disagree.error().message.find("disagree"), std::string::npos);
  EXPECT_NE(disagree.error().message.find("GPU-aaa"), std::string::npos);
}

TEST(Allocation, TrustedChannelsNamingNoGpuOfTheNodeRefuse) {
  Json ann = spec_with(R"({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=GPU-zzz"}})");
  auto a = decide(ann, false);
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().message.find("GPU-zzz"), std::string::npos);
  Json dev = spec_with("{}");
  dev["linux"]["devices"] = Json::array({gpu_device(7)});
  a = decide(dev, false);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().message, "device spec /dev/nvidia7 (195:7) names no GPU of this node");
  Json bad_ann = spec_with(R"({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=0:1"}})");
  auto r = read_allocation_channels(bad_ann, RuntimeConfig{}, false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("MIG is not supported yet"), std::string::npos);
}

TEST(Allocation, MarkersAreReadLeniently) {
  Json spec = spec_with("{}");
  spec["mounts"].push_back(marker("GPU-"));
  auto ch = read_allocation_channels(spec, RuntimeConfig{}, false);
  ASSERT_TRUE(ch) << "a pod can write a marker: a malformed one is ignored";
  EXPECT_TRUE(ch->markers.empty());
  ASSERT_EQ(ch->ignored.size(), 1u);
  Json not_null = spec_with("{}");
  not_null["mounts"].push_back(marker("GPU-bbb"));
  not_null["mounts"][0]["source"] = "/tmp/x";
  EXPECT_TRUE(read_allocation_channels(not_null, RuntimeConfig{}, true)->markers.empty())
      << "only /dev/null sources are markers";
  // With mount-markers not trusted at all, a privileged marker is nothing either.
  RuntimeConfig cfg;
  cfg.trusted_channels = {Channel::cdi_annotations};
  Json priv = spec_with("{}");
  priv["mounts"].push_back(marker("GPU-bbb"));
  EXPECT_TRUE(decide(priv, true, cfg)->granted.empty());
}

// A pod's hostPath of the cgroup filesystem: on cgroup v1, euid 0 can write cgroup.procs and
// join the root devices cgroup (found by an attack with real runc; docs/trust-model.md).
TEST(MountGuard, BindsOfCgroupFilesystemsAreRefused) {
  auto cg = cgroup_mount_points(
      "25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
      "26 25 0:23 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
      "27 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
      "28 30 8:1 / /var/lib/kubelet rw - ext4 /dev/sda1 rw\n"
      "29 30 0:25 / /mnt/with\\040space rw - cgroup cgroup rw,memory\n");
  EXPECT_EQ(cg, (std::vector<std::string>{"/sys/fs/cgroup/devices", "/sys/fs/cgroup/unified",
                                          "/mnt/with space"}));
  auto same = [](const std::string& p) { return p; };
  auto spec_with_mount = [](const char* source, const char* options) {
    Json spec = Json::object();
    spec["mounts"] = Json::array({Json{{"destination", "/host-cg"},
                                       {"type", "bind"},
                                       {"source", source},
                                       {"options", Json::parse(options)}}});
    return spec;
  };
  for (const char* src : {"/sys/fs/cgroup", "/sys", "/"}) {
    auto r = refuse_cgroupfs_binds(spec_with_mount(src, R"(["rbind","ro"])"), cg, same);
    ASSERT_FALSE(r) << src << ": an rbind carries the hierarchies below it";
    EXPECT_NE(r.error().message.find("devices cgroup"), std::string::npos);
  }
  EXPECT_FALSE(refuse_cgroupfs_binds(
      spec_with_mount("/sys/fs/cgroup/devices/kubepods", R"(["bind"])"), cg, same))
      << "inside a hierarchy, recursive or not";
  EXPECT_TRUE(refuse_cgroupfs_binds(spec_with_mount("/sys", R"(["bind"])"), cg, same))
      << "a plain bind of an ancestor shows only empty mount points";
  EXPECT_TRUE(
      refuse_cgroupfs_binds(spec_with_mount("/var/lib/kubelet/pods/x", R"(["rbind"])"), cg, same));
  EXPECT_TRUE(refuse_cgroupfs_binds(spec_with_mount("/sys/fs/cgroupx", R"(["rbind"])"), cg, same));
  // A symlink is judged by what it resolves to.
  auto link = [](const std::string& p) {
    return p == "/tmp/cg-link" ? std::string("/sys/fs/cgroup/devices") : p;
  };
  EXPECT_FALSE(refuse_cgroupfs_binds(spec_with_mount("/tmp/cg-link", R"(["rbind"])"), cg, link));
}
