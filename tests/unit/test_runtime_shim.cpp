// The shim's create flow through its seams: a fake host root for the driver's files, a table of
// the host's device facts (no mknod: these run without root) and an InventoryFactory that counts
// NVML opens. HostDeviceFacts' own tests read real nodes.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "runtime/mount_guard.hpp"
#include "runtime/shim.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

constexpr const char* kUuid0 = "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01";
constexpr const char* kUuid1 = "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2";

class ShimFlow : public ::testing::Test {
 protected:
  void SetUp() override {
    for (unsigned i = 0; i < 2; ++i) {
      m_nodes["/dev/nvidia" + std::to_string(i)] = {195, i};
      std::string bus = "0000:0" + std::to_string(i + 1) + ":00.0";
      m_root.write("proc/driver/nvidia/gpus/" + bus + "/information",
                   cat("Model: \t\t Fake\nGPU UUID: \t ", i == 0 ? kUuid0 : kUuid1,
                       "\nBus Location: \t ", bus, "\nDevice Minor: \t ", i, "\n"));
    }
    m_nodes["/dev/nvidiactl"] = {195, 255};
    m_proc_devices =
        "Character devices:\n  1 mem\n  4 tty\n 10 misc\n195 nvidia-frontend\n\n"
        "Block devices:\n  8 sd\n";
    m_config.device_root = m_root.path().string();
    m_config.log_file = "";
    m_inventory.list = {gpu(0, kUuid0), gpu(1, kUuid1)};
  }

  static Gpu gpu(unsigned i, const char* uuid) {
    Gpu g;
    g.index = i;
    g.minor = i;
    g.uuid = uuid;
    g.pci_bus_id = "00000000:0" + std::to_string(i + 1) + ":00.0";
    return g;
  }

  // The host as read_host_device_facts would report it: only what the query names.
  HostDeviceFacts read_facts(const HostDeviceQuery& query) {
    ++m_fact_reads;
    HostDeviceFacts facts;
    if (m_proc_devices) facts.registered = parse_proc_devices(*m_proc_devices);
    for (const auto& path : query.char_paths) {
      auto it = m_nodes.find(path);
      facts.char_nodes.emplace(
          path, it == m_nodes.end()
                    ? Result<DeviceNode>(fail(Errc::not_found, path, ": no such node"))
                    : DeviceNode{path, it->second.first, it->second.second});
    }
    if (query.drm_nodes) facts.drm_nodes = m_drm;
    return facts;
  }

  // Writes a bundle whose config.json is `spec` and runs prepare_bundle on it.
  Result<ShimDecision> prepare(const Json& spec) {
    m_bundle = m_dir.path() / ("b" + std::to_string(++m_count));
    std::filesystem::create_directories(m_bundle);
    m_text = spec.dump();
    EXPECT_TRUE(write_file_atomic(m_bundle / "config.json", m_text));
    ShimContext ctx{m_config,
                    m_log,
                    [this]() -> Result<std::unique_ptr<GpuInventory>> {
                      ++m_nvml_opens;
                      auto inv = std::make_unique<test::FakeInventory>();
                      inv->list = m_inventory.list;
                      return std::unique_ptr<GpuInventory>(std::move(inv));
                    },
                    "/usr/local/bin/gpufence-runtime",
                    CdiEdits::apply,
                    [this](const HostDeviceQuery& q) { return read_facts(q); }};
    RuncInvocation inv;
    inv.subcommand = "create";
    inv.bundle = m_bundle.string();
    inv.container_id = "c" + std::to_string(m_count);
    return prepare_bundle(inv, ctx);
  }

  Json written() { return Json::parse(read_file(m_bundle / "config.json").value_or("null")); }
  bool untouched() { return read_file(m_bundle / "config.json").value_or("") == m_text; }

  test::TempDir m_root, m_dir;
  RuntimeConfig m_config;
  Logger m_log{LogLevel::off};
  test::FakeInventory m_inventory;
  std::map<std::string, std::pair<unsigned, unsigned>> m_nodes;  // host char nodes
  std::optional<std::string> m_proc_devices;
  std::vector<DrmNode> m_drm;
  int m_fact_reads = 0;
  int m_nvml_opens = 0;
  int m_count = 0;
  std::filesystem::path m_bundle;
  std::string m_text;
};

Json unprivileged() {
  return Json::parse(R"({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]},
    "root": {"path": "rootfs"}, "mounts": [],
    "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}})");
}

}  // namespace

TEST_F(ShimFlow, UuidAllocationsResolveFromTheDriverWithoutOpeningNvml) {
  Json spec = unprivileged();
  spec["annotations"]["cdi.k8s.io/gpufence_x"] = std::string("nvidia.com/gpu=") + kUuid1;
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(m_nvml_opens, 0);
  EXPECT_EQ(d->inventory_source, "driver-procfs");
  EXPECT_EQ(d->granted, (std::vector<std::string>{kUuid1}));
  Json out = written();
  ASSERT_EQ(out["linux"]["devices"].size(), 2u);
  EXPECT_EQ(out["linux"]["devices"][0]["path"], "/dev/nvidia1");
  EXPECT_EQ(out["linux"]["devices"][1]["path"], "/dev/nvidiactl");
  // The driver-procfs hook, with its own environment and a timeout.
  const Json& hook = out["hooks"]["createContainer"][0];
  EXPECT_EQ(hook["path"], "/usr/local/bin/gpufence-runtime");
  EXPECT_EQ(hook["env"], Json::parse(R"(["PATH=/usr/sbin:/usr/bin:/sbin:/bin"])"));
  EXPECT_GT(hook["timeout"].get<int>(), 0);
}

TEST_F(ShimFlow, IndicesNeedNvmlsNumbering) {
  Json spec = unprivileged();
  spec["annotations"]["cdi.k8s.io/gpufence_x"] = "nvidia.com/gpu=1";
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(m_nvml_opens, 1);
  EXPECT_EQ(d->inventory_source, "nvml");
  EXPECT_EQ(d->granted, (std::vector<std::string>{kUuid1}));
}

TEST_F(ShimFlow, AContainerThatAsksForNothingIsLeftByteForByte) {
  auto d = prepare(unprivileged());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(m_nvml_opens, 0);
  EXPECT_FALSE(d->spec_changed);
  EXPECT_TRUE(untouched());
}

TEST_F(ShimFlow, RefusalsLeaveConfigJsonAsItWas) {
  Json spec = unprivileged();
  spec["annotations"]["cdi.k8s.io/gpufence_x"] = "nvidia.com/gpu=GPU-deadbeef";
  auto d = prepare(spec);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("GPU-deadbeef"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());

  Json bad = unprivileged();
  bad["process"]["env"] = Json::array({"PATH=/bin", 7});
  d = prepare(bad);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("process.env[1] must be a string"), std::string::npos)
      << d.error().message;
  EXPECT_TRUE(untouched());

  // Found by the fuzzer (tests/fuzz/corpus/oci_spec/crash-device-major-null): a null device
  // number passed the check and then threw where the node is read.
  Json null_major = unprivileged();
  null_major["linux"]["devices"] =
      Json::parse(R"([{"path": "/dev/nvidia0", "type": "c", "major": null, "minor": 0}])");
  d = prepare(null_major);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("linux.devices[0].major must be a non-negative integer"),
            std::string::npos)
      << d.error().message;
  EXPECT_TRUE(untouched());
  Json null_type = unprivileged();
  null_type["linux"]["devices"] =
      Json::parse(R"([{"path": "/dev/nvidia1", "type": null, "major": 195, "minor": 1}])");
  d = prepare(null_type);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("linux.devices[0].type must be a string"), std::string::npos)
      << d.error().message;
  Json null_source = unprivileged();
  null_source["mounts"] = Json::parse(R"([{"destination": "/x", "source": null, "type": "bind"}])");
  d = prepare(null_source);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("mounts[0].source must be a string"), std::string::npos)
      << d.error().message;
  EXPECT_TRUE(untouched());
}

TEST_F(ShimFlow, PrivilegedSpecNeedsTheHostsMajorsToBeNarrowed) {
  Json spec = unprivileged();
  spec["linux"]["resources"]["devices"] = Json::parse(R"([{"allow": true, "access": "rwm"}])");
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->admits_all_devices);
  EXPECT_TRUE(d->whitelisted);
  m_proc_devices.reset();
  d = prepare(spec);
  ASSERT_FALSE(d) << "fail closed: no whitelist can be written";
  EXPECT_NE(d.error().message.find("device majors"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());
}

TEST_F(ShimFlow, EveryHookGetsAFixedEnvironment) {
  Json spec = unprivileged();
  spec["hooks"]["prestart"] = Json::parse(R"([{"path": "/usr/bin/other-vendor-hook"},
      {"path": "/usr/bin/with-env", "env": ["A=1"], "timeout": 5}])");
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  Json out = written();
  EXPECT_EQ(out["hooks"]["prestart"][0]["env"],
            Json::parse(R"(["PATH=/usr/sbin:/usr/bin:/sbin:/bin"])"));
  EXPECT_EQ(out["hooks"]["prestart"][1]["env"], Json::parse(R"(["A=1"])")) << "its own env stays";
  EXPECT_EQ(out["hooks"]["prestart"][1]["timeout"], 5);
}

TEST(ReadSpec, DeepNestingIsAnErrorNotAStackOverflow) {
  test::TempDir dir;
  // Found by an attack: 200,000 nested arrays crashed the parser (SIGSEGV, nothing on stderr).
  dir.write("config.json", std::string(200000, '[') + std::string(200000, ']'));
  auto r = read_spec(dir / "config.json");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("nested deeper than"), std::string::npos);
  dir.write("ok.json",
            R"({"process": {"env": ["A=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]}})");
  EXPECT_TRUE(read_spec(dir / "ok.json")) << "brackets inside strings do not count";
}

TEST(ReadSpec, ANumberThatOverflowsIsAnErrorNotAnException) {
  test::TempDir dir;
  // nlohmann's out_of_range (406), not a parse_error: it escaped read_spec's handler.
  dir.write("config.json", R"({"process": {"user": {"uid": 1E99999}}})");
  auto r = read_spec(dir / "config.json");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("number overflow"), std::string::npos) << r.error().message;
}

// CDI is judged by device numbers: another GPU's node under any name is refused, whatever path
// the spec gives it, and the decision names every node granted.
class ShimCdi : public ShimFlow {
 protected:
  Result<ShimDecision> with_spec(const std::string& device_nodes, const std::string& mounts = "") {
    m_cdi.write("cdi/nvidia.yaml",
                cat("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: ", kUuid1,
                    "\n  containerEdits:\n    deviceNodes:\n", device_nodes, mounts));
    m_config.cdi_spec_dirs = {(m_cdi / "cdi").string()};
    Json spec = unprivileged();
    spec["annotations"]["cdi.k8s.io/gpufence_x"] = std::string("nvidia.com/gpu=") + kUuid1;
    return prepare(spec);
  }
  test::TempDir m_cdi;
};

TEST_F(ShimCdi, AnotherGpusNodeUnderAnyPathIsRefused) {
  for (const char* alias : {"/dev/gpu-alias", "/dev/./nvidia0"}) {
    auto d = with_spec(cat("    - {path: /dev/nvidia1, major: 195, minor: 1}\n    - {path: ", alias,
                           ", major: 195, minor: 0}\n"));
    ASSERT_FALSE(d) << alias << " gave GPU 0 to a container allocated GPU 1";
    EXPECT_NE(d.error().message.find("char 195:0"), std::string::npos) << d.error().message;
    EXPECT_TRUE(untouched());
  }
  // Without numbers in the spec: the host node a hostPath names decides.
  auto d = with_spec("    - {path: /dev/gpu-alias, hostPath: /dev/nvidia0}\n");
  ASSERT_FALSE(d) << "hostPath /dev/nvidia0 is GPU 0";
  EXPECT_TRUE(untouched());
}

TEST_F(ShimCdi, TheGrantedGpuUnderAnotherNameIsItsOwnAndLogged) {
  auto d = with_spec(
      "    - {path: /dev/nvidia1, major: 195, minor: 1}\n"
      "    - {path: /dev/gpu-mine, major: 195, minor: 1}\n",
      "    mounts:\n    - {hostPath: /usr/lib/libcuda.so.1, containerPath: "
      "/usr/lib/libcuda.so.1}\n");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_NE(std::find(d->granted_nodes.begin(), d->granted_nodes.end(), "/dev/gpu-mine=c195:1"),
            d->granted_nodes.end())
      << join(d->granted_nodes, ",");
  EXPECT_NE(std::find(d->granted_nodes.begin(), d->granted_nodes.end(), "/dev/nvidia1=c195:1"),
            d->granted_nodes.end());
  EXPECT_EQ(d->cdi_mounts,
            (std::vector<std::string>{"/usr/lib/libcuda.so.1<-/usr/lib/libcuda.so.1"}));
}

// The device plugin's kind beside NVIDIA's toolkit's spec defining the same names in the same
// directory: each kind is its own device (upstream keys by kind and name), so the plugin's name
// resolves to the plugin's file alone; and a broken spec of a kind the container does not ask
// for refuses nothing.
TEST_F(ShimCdi, ThePluginsKindResolvesBesideNvidiasSpecOfTheSameNames) {
  auto spec_of = [](std::string_view kind, std::string_view lib) {
    return cat("cdiVersion: 0.5.0\nkind: ", kind, "\ndevices:\n- name: ", kUuid1,
               "\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/nvidia1, major: 195, "
               "minor: 1}\n    mounts:\n    - {hostPath: ",
               lib, ", containerPath: ", lib, "}\n");
  };
  m_cdi.write("cdi/nvidia.yaml", spec_of(kNvidiaCdiKind, "/usr/lib/from-nvidia-ctk.so"));
  m_cdi.write("cdi/gpufence.io-gpu.json", spec_of(kCdiKind, "/usr/lib/from-the-plugin.so"));
  m_cdi.write("cdi/operator.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: 5\n");
  m_config.cdi_spec_dirs = {(m_cdi / "cdi").string()};
  Json spec = unprivileged();
  spec["annotations"]["cdi.k8s.io/gpufence_x"] = gpu_cdi_name(kUuid1);
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->cdi_devices,
            (std::vector<std::string>{cat(kCdiKind, "=", kUuid1, " (",
                                          (m_cdi / "cdi/gpufence.io-gpu.json").string(), ")")}));
  EXPECT_EQ(d->cdi_mounts,
            (std::vector<std::string>{"/usr/lib/from-the-plugin.so<-/usr/lib/from-the-plugin.so"}));
  // The same container asking by NVIDIA's kind reads NVIDIA's specs: the broken one refuses it.
  Json nvidia = unprivileged();
  nvidia["annotations"]["cdi.k8s.io/gpufence_x"] = cat(kNvidiaCdiKind, "=", kUuid1);
  auto refused = prepare(nvidia);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("operator.yaml"), std::string::npos)
      << refused.error().message;
}

// Another DRA driver's kind, listed in [cdi] gpu_kinds (NVIDIA's driver: one transient spec per
// claim, its devices named "<claim uid>-gpu-N", the GPU's node left to the host's numbers): the
// name stands for the GPU nodes its spec gives, judged by device number.
class ShimListedKind : public ShimCdi {
 protected:
  static constexpr const char* kKind = "k8s.gpu.nvidia.com/claim";
  static constexpr const char* kClaim = "k8s.gpu.nvidia.com/claim=5e1f-gpu-1";
  void SetUp() override {
    ShimCdi::SetUp();
    write_claim_spec("    - {path: /dev/nvidia1}\n");
    m_config.cdi_spec_dirs = {(m_cdi / "cdi").string()};
    m_config.gpu_cdi_kinds = {kKind};
  }
  void write_claim_spec(const std::string& device_nodes) {
    m_cdi.write("cdi/k8s.gpu.nvidia.com-claim_5e1f.yaml",
                cat("cdiVersion: 0.5.0\nkind: ", kKind,
                    "\ncontainerEdits:\n  deviceNodes:\n  - {path: /dev/nvidiactl}\n"
                    "  env: [NVIDIA_VISIBLE_DEVICES=void]\ndevices:\n- name: 5e1f-gpu-1\n"
                    "  containerEdits:\n    deviceNodes:\n",
                    device_nodes));
  }
  static Json privileged() {
    Json spec = unprivileged();
    spec["linux"]["resources"]["devices"] = Json::parse(R"([{"allow": true, "access": "rwm"}])");
    spec["linux"]["devices"] = Json::parse(R"([
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}])");
    return spec;
  }
};

TEST_F(ShimListedKind, APrivilegedContainerGetsTheGpuItsClaimSpecGives) {
  Json spec = privileged();
  spec["annotations"]["cdi.k8s.io/gpufence-nri.cri-cdi-devices"] = kClaim;
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->granted, (std::vector<std::string>{kUuid1}));
  EXPECT_EQ(d->channel, Channel::cdi_annotations);
  EXPECT_EQ(d->removed_nodes, (std::vector<std::string>{"/dev/nvidia0"}));
  // The claim's own edits are the runtime's to inject (containerd did, before NRI): not re-added.
  EXPECT_TRUE(d->cdi_devices.empty());

  // Unlisted, the kind is another vendor's device: a privileged container gets no GPU.
  m_config.gpu_cdi_kinds.clear();
  d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->granted.empty());
}

TEST_F(ShimListedKind, NumbersInTheSpecCountAsTheRuntimeWouldUseThem) {
  // A node named like GPU 1 with GPU 0's numbers is GPU 0; a block device and a non-GPU minor of
  // major 195 (nvidiactl) are no GPU.
  write_claim_spec(
      "    - {path: /dev/nvidia1, type: c, major: 195, minor: 0}\n"
      "    - {path: /dev/sdz, type: b, major: 195, minor: 1}\n"
      "    - {path: /dev/ctl-alias, major: 195, minor: 255}\n");
  Json spec = privileged();
  spec["annotations"]["cdi.k8s.io/gpufence-nri.cri-cdi-devices"] = kClaim;
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->granted, (std::vector<std::string>{kUuid0}));
}

TEST_F(ShimListedKind, WhatCannotBeResolvedRefusesTheContainer) {
  Json spec = privileged();
  // A name no spec defines (the claim was unprepared, or forged).
  spec["annotations"]["cdi.k8s.io/gpufence-nri.cri-cdi-devices"] =
      "k8s.gpu.nvidia.com/claim=5e1f-gpu-7";
  auto d = prepare(spec);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("unknown CDI device"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());
  // A node the host lacks: its numbers cannot be known, so nothing is granted on the name.
  write_claim_spec("    - {path: /dev/nvidia9}\n");
  spec["annotations"]["cdi.k8s.io/gpufence-nri.cri-cdi-devices"] = kClaim;
  d = prepare(spec);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("/dev/nvidia9"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());
  // A GPU minor the node has no GPU for.
  write_claim_spec("    - {path: /dev/nvidia7, major: 195, minor: 7}\n");
  d = prepare(spec);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("names no GPU of this node"), std::string::npos)
      << d.error().message;
}

TEST_F(ShimListedKind, TheClaimAndTheDeviceSpecsMustAgree) {
  // Unprivileged: containerd injected the claim's node (GPU 1) as a device spec; a spec that
  // holds GPU 0's node instead disagrees with the claim and is refused.
  Json spec = unprivileged();
  spec["annotations"]["cdi.k8s.io/gpufence-nri.cri-cdi-devices"] = kClaim;
  spec["linux"]["devices"] =
      Json::parse(R"([{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}])");
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->granted, (std::vector<std::string>{kUuid1}));
  spec["linux"]["devices"] =
      Json::parse(R"([{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 0}])");
  d = prepare(spec);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("channels disagree"), std::string::npos) << d.error().message;
}

// A DRM node (226:N) the host does not list is not granted on trust.
TEST_F(ShimCdi, AnUnknownDrmNodeIsRefused) {
  auto d = with_spec(
      "    - {path: /dev/nvidia1, major: 195, minor: 1}\n"
      "    - {path: /dev/dri/renderD200, major: 226, minor: 200}\n");
  ASSERT_FALSE(d) << "226:200 is in no /sys/class/drm of this host";
  EXPECT_NE(d.error().message.find("does not list"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());
}

TEST_F(ShimFlow, AHostToContainerVolumeIsRefused) {
  Json spec = unprivileged();
  spec["mounts"] = Json::parse(
      R"([{"destination": "/v", "type": "bind", "source": "/tmp", "options": ["rbind", "rslave"]}])");
  auto d = prepare(spec);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("rslave propagation"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());
}

// A CDI mount passes the same cgroup-filesystem rule as a pod's volume.
TEST_F(ShimCdi, ACgroupfsMountFromASpecIsRefused) {
  auto mountinfo = read_file("/proc/self/mountinfo");
  ASSERT_TRUE(mountinfo);
  auto cg = cgroup_mount_points(*mountinfo);
  if (cg.empty()) GTEST_SKIP() << "no cgroup filesystem is mounted on this machine";
  auto d = with_spec("    - {path: /dev/nvidia1, major: 195, minor: 1}\n",
                     cat("    mounts:\n    - {hostPath: ", cg.front(),
                         ", containerPath: /host-cg, options: [rbind, rw]}\n"));
  ASSERT_FALSE(d) << "a CDI mount of " << cg.front() << " was applied";
  EXPECT_NE(d.error().message.find("cgroup filesystem"), std::string::npos) << d.error().message;
  EXPECT_TRUE(untouched());
}

// The mount-table check is the last createContainer hook of every unprivileged spec with a bind
// mount, after a CDI spec's own hooks; a privileged spec (the host anyway) gets none.
TEST_F(ShimFlow, TheCgroupMountsHookRunsLastForBindMounts) {
  Json spec = unprivileged();
  spec["mounts"] = Json::parse(
      R"([{"destination": "/data", "type": "bind", "source": "/tmp", "options": ["rbind"]}])");
  spec["hooks"]["createContainer"] = Json::parse(R"([{"path": "/usr/bin/vendor-hook"}])");
  auto d = prepare(spec);
  ASSERT_TRUE(d) << d.error().message;
  Json out = written();
  const Json& hooks = out["hooks"]["createContainer"];
  ASSERT_EQ(hooks.size(), 2u);
  EXPECT_EQ(hooks[1]["args"], Json::parse(R"(["gpufence-runtime", "hook", "cgroup-mounts"])"));
  EXPECT_EQ(hooks[1]["path"], "/usr/local/bin/gpufence-runtime");
  EXPECT_GT(hooks[1]["timeout"].get<int>(), 0);

  Json priv = spec;
  priv["linux"]["resources"]["devices"] = Json::parse(R"([{"allow": true, "access": "rwm"}])");
  d = prepare(priv);
  ASSERT_TRUE(d) << d.error().message;
  out = written();
  for (const auto& h : out["hooks"]["createContainer"])
    EXPECT_EQ(h.value("args", Json::array()).dump().find("cgroup-mounts"), std::string::npos)
        << h.dump();
}

// One decision reads the host's device facts once, and asks for every fact its steps judge by:
// the nodes a CDI spec leaves to the host, and the DRM list a privileged spec's nodes are kept
// or removed by (a fact left out would read as absent and remove the other vendor's card too).
TEST_F(ShimCdi, TheHostsDeviceFactsAreReadOncePerDecision) {
  auto d = with_spec(
      "    - {path: /dev/nvidia1, major: 195, minor: 1}\n"
      "    - {path: /dev/gpu-mine, hostPath: /dev/nvidia1}\n");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(m_fact_reads, 1);
  EXPECT_NE(std::find(d->granted_nodes.begin(), d->granted_nodes.end(), "/dev/gpu-mine=c195:1"),
            d->granted_nodes.end())
      << join(d->granted_nodes, ",");

  m_drm = {{"card0", 0, "0000:00:02.0", false},
           {"card1", 1, "0000:01:00.0", true},
           {"card2", 2, "0000:02:00.0", true}};
  Json priv = unprivileged();
  priv["linux"]["resources"]["devices"] = Json::parse(R"([{"allow": true, "access": "rwm"}])");
  priv["linux"]["devices"] = Json::parse(R"([
      {"path": "/dev/dri/card0", "type": "c", "major": 226, "minor": 0},
      {"path": "/dev/dri/card1", "type": "c", "major": 226, "minor": 1},
      {"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2}])");
  priv["annotations"]["cdi.k8s.io/gpufence_x"] = std::string("nvidia.com/gpu=") + kUuid1;
  m_config.cdi_spec_dirs = {};  // no CDI node asks for the DRM list: the spec's rules must
  m_fact_reads = 0;
  d = prepare(priv);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(m_fact_reads, 1);
  EXPECT_EQ(d->removed_nodes, (std::vector<std::string>{"/dev/dri/card1"}))
      << "GPU 0's card goes; the other vendor's and GPU 1's stay";
}
