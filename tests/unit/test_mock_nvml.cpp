// The mock libnvidia-ml.so.1's opt-in driver visibility and process accounting
// (docs/mock-nvml.md), seen through the project's own NVML loader.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gpu/nvml_inventory.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

class MockNvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Regular files stand in for the nodes: they open O_RDWR, as a node the cgroup allows.
    for (unsigned i = 0; i < 3; ++i) {
      char bus[32];
      std::snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x10 + i);
      m_dir.write("procfs/" + std::string(bus) + "/information",
                  "Device Minor: " + std::to_string(i) + "\n");
      m_dir.write("dev/nvidia" + std::to_string(i), "");
    }
    ::setenv("MOCK_NVML_PROCFS_DIR", (m_dir / "procfs").c_str(), 1);
    ::setenv("MOCK_NVML_DEV_DIR", (m_dir / "dev").c_str(), 1);
    ::unsetenv("MOCK_NVML_EVENTS");
    ::unsetenv("MOCK_NVML_PROCESSES");
  }
  void TearDown() override {
    for (const char* v : {"MOCK_NVML_VISIBILITY", "MOCK_NVML_PROCFS_DIR", "MOCK_NVML_DEV_DIR",
                          "MOCK_NVML_PROCESSES"})
      ::unsetenv(v);
  }
  std::vector<std::string> visible_uuids(const nlohmann::json& cfg) {
    auto path = m_dir.write("nvml.json", cfg.dump());
    ::setenv("MOCK_NVML_CONFIG", path.c_str(), 1);
    auto inv = NvmlInventory::open(test::mock_nvml_library(), HostFs(m_dir / "host"));
    EXPECT_TRUE(inv) << inv.error().message;
    if (!inv) return {};
    auto gpus = (*inv)->gpus();
    EXPECT_TRUE(gpus) << gpus.error().message;
    std::vector<std::string> out;
    for (const auto& g : gpus.value_or(std::vector<Gpu>{})) {
      EXPECT_EQ(g.index, out.size()) << "visible GPUs are numbered from 0";
      out.push_back(g.uuid);
    }
    return out;
  }
  test::TempDir m_dir;
};

std::vector<std::string> uuids(std::initializer_list<unsigned> idx) {
  std::vector<std::string> out;
  for (unsigned i : idx) out.push_back(test::mock_uuid(i));
  return out;
}

}  // namespace

TEST_F(MockNvmlTest, VisibilityOffListsEveryGpuWhateverTheNode) {
  std::filesystem::remove_all(m_dir / "procfs");
  std::filesystem::remove_all(m_dir / "dev");
  EXPECT_EQ(visible_uuids(test::mock_gpus(3)), uuids({0, 1, 2}));
}

TEST_F(MockNvmlTest, DriverVisibilityNeedsTheProcfsEntry) {
  ::setenv("MOCK_NVML_VISIBILITY", "driver", 1);
  EXPECT_EQ(visible_uuids(test::mock_gpus(3)), uuids({0, 1, 2}));
  std::filesystem::remove_all(m_dir / "procfs/0000:11:00.0");
  EXPECT_EQ(visible_uuids(test::mock_gpus(3)), uuids({0, 2}));
}

TEST_F(MockNvmlTest, DriverVisibilityNeedsTheDeviceNode) {
  auto cfg = test::mock_gpus(3);
  cfg["visibility"] = "driver";  // the config key works as the env does
  std::filesystem::remove(m_dir / "dev/nvidia0");
  EXPECT_EQ(visible_uuids(cfg), uuids({1, 2}));
}

TEST_F(MockNvmlTest, AnUnopenableNodeHidesTheGpu) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root opens a mode-000 file; the runc scenario covers EPERM";
  ::setenv("MOCK_NVML_VISIBILITY", "driver", 1);
  std::filesystem::permissions(m_dir / "dev/nvidia2", std::filesystem::perms::none);
  EXPECT_EQ(visible_uuids(test::mock_gpus(3)), uuids({0, 1}));
}

TEST_F(MockNvmlTest, ABadVisibilityValueFailsInit) {
  auto cfg = test::mock_gpus(1);
  cfg["visibility"] = "some";
  auto path = m_dir.write("nvml.json", cfg.dump());
  ::setenv("MOCK_NVML_CONFIG", path.c_str(), 1);
  EXPECT_FALSE(NvmlInventory::open(test::mock_nvml_library(), HostFs(m_dir / "host")));
}

TEST_F(MockNvmlTest, AccountingListsLiveProcessesAndDropsGoneOnes) {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  char ns[64] = {};
  ASSERT_GT(::readlink("/proc/self/ns/pid", ns, sizeof ns - 1), 0);
  auto file = m_dir.write("processes", std::to_string(::getpid()) + " " + test::mock_uuid(1) +
                                           " 300 " + ns + "\n" + std::to_string(dead) + " " +
                                           test::mock_uuid(1) + " 100\nnot a line\n");
  ::setenv("MOCK_NVML_PROCESSES", file.c_str(), 1);
  auto path = m_dir.write("nvml.json", test::mock_gpus(2).dump());
  ::setenv("MOCK_NVML_CONFIG", path.c_str(), 1);
  auto inv = NvmlInventory::open(test::mock_nvml_library(), HostFs(m_dir / "host"));
  ASSERT_TRUE(inv) << inv.error().message;
  auto on1 = (*inv)->processes(test::mock_uuid(1));
  ASSERT_TRUE(on1) << on1.error().message;
  ASSERT_EQ(on1->size(), 1u);
  EXPECT_EQ((*on1)[0].pid, static_cast<unsigned>(::getpid()));
  EXPECT_EQ((*on1)[0].used_memory, std::optional<std::uint64_t>(300ULL << 20));
  auto on0 = (*inv)->processes(test::mock_uuid(0));
  ASSERT_TRUE(on0);
  EXPECT_TRUE(on0->empty());
}
