// The NVML loader against the project's mock libnvidia-ml.so.1, loaded through dlopen exactly as
// the driver's library would be.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "gpu/nvml_inventory.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

class NvmlTest : public ::testing::Test {
 protected:
  Result<std::unique_ptr<NvmlInventory>> open(const nlohmann::json& cfg,
                                              const std::string& variant = "default") {
    auto path = m_dir.write("nvml.json", cfg.dump());
    ::setenv("MOCK_NVML_CONFIG", path.c_str(), 1);
    ::unsetenv("MOCK_NVML_EVENTS");
    return NvmlInventory::open(test::mock_nvml_library(variant), HostFs(m_dir / "host"));
  }
  test::TempDir m_dir;
};

}  // namespace

TEST_F(NvmlTest, DiscoversZeroOneTwoAndEightGpus) {
  for (unsigned count : {0u, 1u, 2u, 8u}) {
    auto inv = open(test::mock_gpus(count));
    ASSERT_TRUE(inv) << inv.error().message;
    auto gpus = (*inv)->gpus();
    ASSERT_TRUE(gpus) << gpus.error().message;
    ASSERT_EQ(gpus->size(), count);
    for (unsigned i = 0; i < count; ++i) {
      const Gpu& g = (*gpus)[i];
      EXPECT_EQ(g.index, i);
      EXPECT_EQ(g.uuid, test::mock_uuid(i));
      EXPECT_EQ(g.minor, i);
      EXPECT_EQ(g.name, "NVIDIA Test GPU");
      EXPECT_EQ(g.memory_total, 16ULL << 30);
      EXPECT_EQ(g.driver_version, "550.54.15");
      char bus[32];
      std::snprintf(bus, sizeof bus, "00000000:%02X:00.0", 0x10 + i);
      EXPECT_EQ(g.pci_bus_id, bus);
      ASSERT_TRUE(g.numa_node.has_value());
    }
    EXPECT_EQ((*inv)->driver_version(), "550.54.15");
  }
}

TEST_F(NvmlTest, TheSeedNodeExample) {
  std::ifstream in(test::source_path("tools/mock-nvml/examples/two-rtx3080.json"));
  auto inv = open(nlohmann::json::parse(in));
  ASSERT_TRUE(inv);
  auto gpus = (*inv)->gpus().value();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].name, "NVIDIA GeForce RTX 3080");
  EXPECT_NE(gpus[0].uuid, gpus[1].uuid);
  EXPECT_EQ(gpus[1].minor, 1u);
  EXPECT_EQ(gpus[0].memory_total, 10ULL << 30);
}

TEST_F(NvmlTest, MissingLibraryIsAClearError) {
  auto inv = NvmlInventory::open("/nonexistent/libnvidia-ml.so.1", HostFs("/"));
  ASSERT_FALSE(inv);
  EXPECT_EQ(inv.error().code, Errc::nvml);
  EXPECT_NE(inv.error().message.find("cannot load NVML library /nonexistent/libnvidia-ml.so.1"),
            std::string::npos);
}

TEST_F(NvmlTest, LibraryLackingASymbolIsAClearError) {
  auto inv = open(test::mock_gpus(1), "no-uuid");
  ASSERT_FALSE(inv);
  EXPECT_NE(inv.error().message.find("lacks required symbol(s) nvmlDeviceGetUUID"),
            std::string::npos)
      << inv.error().message;
}

TEST_F(NvmlTest, InitFailureCarriesNvmlErrorString) {
  auto cfg = test::mock_gpus(1);
  cfg["init_error"] = 9;
  auto inv = open(cfg);
  ASSERT_FALSE(inv);
  EXPECT_NE(inv.error().message.find("nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)"),
            std::string::npos)
      << inv.error().message;
}

TEST_F(NvmlTest, MalformedMockConfigFailsInit) {
  m_dir.write("nvml.json", "{ not json");
  ::setenv("MOCK_NVML_CONFIG", (m_dir / "nvml.json").c_str(), 1);
  auto inv = NvmlInventory::open(test::mock_nvml_library(), HostFs("/"));
  ASSERT_FALSE(inv);
  EXPECT_NE(inv.error().message.find("Unknown Error"), std::string::npos);
}

TEST_F(NvmlTest, DeviceQueryErrorsNameTheCallAndGpu) {
  auto cfg = test::mock_gpus(2);
  cfg["fail"] = {{"nvmlDeviceGetMemoryInfo", 15}};
  auto inv = open(cfg);
  ASSERT_TRUE(inv);
  auto gpus = (*inv)->gpus();
  ASSERT_FALSE(gpus);
  EXPECT_EQ(gpus.error().message, "nvmlDeviceGetMemoryInfo (GPU 0): GPU is lost (NVML error 15)");
}

TEST_F(NvmlTest, UnknownUuidIsNotFound) {
  auto inv = open(test::mock_gpus(1));
  ASSERT_TRUE(inv);
  auto procs = (*inv)->processes("GPU-nope");
  ASSERT_FALSE(procs);
  EXPECT_NE(procs.error().message.find("Not Found (NVML error 6)"), std::string::npos);
  EXPECT_FALSE((*inv)->check_alive("GPU-nope"));
  EXPECT_TRUE((*inv)->check_alive(test::mock_uuid(0)));
}

TEST_F(NvmlTest, ProcessesThroughV3AndThroughTheLegacy16ByteSymbol) {
  auto cfg = test::mock_gpus(2);
  for (unsigned pid = 100; pid < 150; ++pid) {  // more than any first guess: exercises regrowth
    cfg["gpus"][0]["processes"].push_back({{"pid", pid}, {"used_memory", pid * 1024ULL}});
  }
  cfg["gpus"][1]["processes"] = {{{"pid", 7}, {"used_memory", 0xFFFFFFFFFFFFFFFFULL}}};
  for (std::string variant : {"default", "legacy"}) {
    auto inv = open(cfg, variant);
    ASSERT_TRUE(inv) << variant << ": " << inv.error().message;
    auto procs = (*inv)->processes(test::mock_uuid(0));
    ASSERT_TRUE(procs) << variant;
    ASSERT_EQ(procs->size(), 50u) << variant;
    for (unsigned i = 0; i < 50; ++i) {
      EXPECT_EQ((*procs)[i].pid, 100 + i) << variant;
      EXPECT_EQ((*procs)[i].used_memory, (100 + i) * 1024ULL) << variant;
    }
    auto other = (*inv)->processes(test::mock_uuid(1)).value();
    ASSERT_EQ(other.size(), 1u);
    EXPECT_EQ(other[0].pid, 7u);
    EXPECT_FALSE(other[0].used_memory.has_value()) << "NVML_VALUE_NOT_AVAILABLE";
  }
}

TEST_F(NvmlTest, NumaNodeFallsBackToSysfsWithoutTheNvmlSymbol) {
  auto cfg = test::mock_gpus(2);
  m_dir.write("host/sys/bus/pci/devices/0000:10:00.0/numa_node", "1\n");
  m_dir.write("host/sys/bus/pci/devices/0000:11:00.0/numa_node", "-1\n");
  auto inv = open(cfg, "legacy");
  ASSERT_TRUE(inv);
  auto gpus = (*inv)->gpus().value();
  EXPECT_EQ(gpus[0].numa_node, 1);
  EXPECT_FALSE(gpus[1].numa_node.has_value());
}

TEST_F(NvmlTest, TopologyNvlinkThenCommonAncestor) {
  auto cfg = test::mock_gpus(3);
  cfg["gpus"][0]["nvlinks"] = {"00000000:11:00.0", "00000000:11:00.0", ""};
  cfg["topology"] = {{{"gpus", {0, 2}}, {"level", "SINGLE"}}};
  auto inv = open(cfg);
  ASSERT_TRUE(inv);
  auto nv = (*inv)->topology(test::mock_uuid(0), test::mock_uuid(1)).value();
  EXPECT_EQ(nv.link, Link::nvlink);
  EXPECT_EQ(nv.nvlinks, 2u);
  EXPECT_EQ((*inv)->topology(test::mock_uuid(0), test::mock_uuid(2)).value().link,
            Link::single_switch);
  EXPECT_EQ((*inv)->topology(test::mock_uuid(1), test::mock_uuid(2)).value().link, Link::system);
}

TEST_F(NvmlTest, XidAndLostGpuEvents) {
  auto cfg = test::mock_gpus(2);
  auto events = m_dir.write("events", "{\"gpu\": 0, \"xid\": 13}\n");  // before init: history
  cfg["events_file"] = events.string();
  auto inv = open(cfg);
  ASSERT_TRUE(inv);
  EXPECT_FALSE((*inv)->wait_event(20ms).value().has_value()) << "timeout gives no event";
  std::ofstream(events, std::ios::app)
      << "{\"gpu\": \"" << test::mock_uuid(1) << "\", \"xid\": 48}\n";
  auto ev = (*inv)->wait_event(1000ms).value();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->uuid, test::mock_uuid(1));
  EXPECT_EQ(ev->xid, 48u);
  EXPECT_FALSE(ev->gpu_lost);

  std::ofstream(events, std::ios::app) << "{\"gpu\": 1, \"lost\": true}\n";
  auto lost = (*inv)->wait_event(1000ms).value();
  ASSERT_TRUE(lost.has_value());
  EXPECT_TRUE(lost->gpu_lost);
  EXPECT_FALSE((*inv)->check_alive(test::mock_uuid(1)));
  EXPECT_TRUE((*inv)->check_alive(test::mock_uuid(0)));
  std::ofstream(events, std::ios::app) << "{\"gpu\": 1, \"lost\": false}\n";
  EXPECT_TRUE((*inv)->check_alive(test::mock_uuid(1)));
}

TEST_F(NvmlTest, RecoveryActionFromTheFieldAndXid154WhenItChanges) {
  auto cfg = test::mock_gpus(2);
  cfg["gpus"][0]["recovery_action"] = 0;  // GPU 1 has none: a driver before R565
  auto events = m_dir.write("events", "");
  cfg["events_file"] = events.string();
  auto inv = open(cfg);
  ASSERT_TRUE(inv) << inv.error().message;
  EXPECT_EQ((*inv)->recovery_action(test::mock_uuid(0)).value(), GpuRecoveryAction::none);
  auto none = (*inv)->recovery_action(test::mock_uuid(1));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::unsupported);
  EXPECT_FALSE((*inv)->wait_event(20ms).value().has_value());  // arms the event set
  std::ofstream(events, std::ios::app) << "{\"gpu\": 0, \"recovery_action\": 2}\n";
  auto ev = (*inv)->wait_event(1000ms).value();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->xid, 154u);
  EXPECT_EQ((*inv)->recovery_action(test::mock_uuid(0)).value(), GpuRecoveryAction::node_reboot);
  std::ofstream(events, std::ios::app) << "{\"gpu\": 0, \"recovery_action\": 9}\n";
  (void)(*inv)->wait_event(1000ms);
  EXPECT_EQ((*inv)->recovery_action(test::mock_uuid(0)).value(), GpuRecoveryAction::other);
}
