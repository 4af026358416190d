// The mock libnvidia-ml.so.1's opt-in driver visibility and process accounting
// (docs/mock-nvml.md), seen through the project's own NVML loader.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "gpu/nvml_abi.hpp"
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

// ---- The C ABI peer software uses, called the way go-nvml does: dlopen, dlsym, call ----

namespace {

// The symbols tools/mock-nvml/nvidia-device-plugin-v0.18.calls lists: the first word of each
// line that is not blank or a comment.
std::vector<std::string> listed_calls() {
  std::ifstream in(test::source_path("tools/mock-nvml/nvidia-device-plugin-v0.18.calls"));
  EXPECT_TRUE(in) << "cannot read the .calls file";
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first;
    if (!(words >> first) || first.starts_with("#")) continue;
    out.push_back(first);
  }
  return out;
}

constexpr nvmlReturn_t kCodes[] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                   16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 999};

class MockNvmlAbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("MOCK_NVML_VISIBILITY");
    ::unsetenv("MOCK_NVML_EVENTS");
    ::unsetenv("MOCK_NVML_PROCESSES");
    m_lib = ::dlopen(test::mock_nvml_library().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(m_lib, nullptr) << ::dlerror();
  }
  void TearDown() override {
    while (m_inits > 0) {
      call<nvmlReturn_t>("nvmlShutdown");
      --m_inits;
    }
    if (m_lib) ::dlclose(m_lib);
  }
  // Writes `cfg`, points the mock at it and initialises; returns nvmlInit_v2's answer.
  nvmlReturn_t init(const nlohmann::json& cfg) {
    auto path = m_dir.write("nvml.json", cfg.dump());
    ::setenv("MOCK_NVML_CONFIG", path.c_str(), 1);
    nvmlReturn_t rc = call<nvmlReturn_t>("nvmlInit_v2");
    if (rc == nvml::SUCCESS) ++m_inits;
    return rc;
  }
  // Calls `name` as R(Args...); a missing symbol is a test failure answering `R{-1}`.
  template <class R, class... Args>
  R call(const char* name, Args... args) {
    void* fn = ::dlsym(m_lib, name);
    if (!fn) {
      ADD_FAILURE() << name << " is not exported";
      return R(-1);
    }
    return reinterpret_cast<R (*)(Args...)>(fn)(args...);
  }
  nvmlDevice_t device(unsigned index) {
    nvmlDevice_t d = nullptr;
    EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetHandleByIndex_v2", index, &d), nvml::SUCCESS);
    return d;
  }
  // What nvmlDeviceGetCudaComputeCapability, GetArchitecture and GetBrand answer for `d`.
  struct Identity {
    int major = -1, minor = -1;
    unsigned arch = 0;
    int brand = -1;
  };
  Identity identity(nvmlDevice_t d) {
    Identity id;
    EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetCudaComputeCapability", d, &id.major, &id.minor),
              nvml::SUCCESS);
    EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetArchitecture", d, &id.arch), nvml::SUCCESS);
    EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetBrand", d, &id.brand), nvml::SUCCESS);
    return id;
  }

  test::TempDir m_dir;
  void* m_lib = nullptr;
  int m_inits = 0;
};

}  // namespace

// Removing any listed function from the mock, or listing one it lacks, fails here.
TEST_F(MockNvmlAbiTest, ExportsEveryFunctionTheDevicePluginListUses) {
  auto calls = listed_calls();
  EXPECT_GE(calls.size(), 40u) << "the .calls file lost entries";
  EXPECT_EQ(std::set<std::string>(calls.begin(), calls.end()).size(), calls.size())
      << "a symbol is listed twice";
  for (const auto& name : calls) EXPECT_NE(::dlsym(m_lib, name.c_str()), nullptr) << name;
  EXPECT_NE(std::find(calls.begin(), calls.end(), "nvmlDeviceGetCudaComputeCapability"),
            calls.end());
}

TEST_F(MockNvmlAbiTest, IdentityComesFromTheConfigElseFromTheName) {
  auto cfg = test::mock_gpus(4);
  cfg["gpus"][0]["cuda_compute_capability"] = {9, 0};  // name says nothing: config wins
  cfg["gpus"][1]["name"] = "NVIDIA GeForce RTX 3080";  // derived from the name
  // gpus[2] keeps "NVIDIA Test GPU": the fixed default
  cfg["gpus"][3]["name"] = "NVIDIA H100 80GB HBM3";
  cfg["gpus"][3]["cuda_compute_capability"] = {8, 9};  // config beats the name
  cfg["gpus"][3]["architecture"] = "Blackwell";        // and beats the capability
  cfg["gpus"][3]["brand"] = "tesla";
  ASSERT_EQ(init(cfg), nvml::SUCCESS);

  auto g0 = identity(device(0));
  EXPECT_EQ(std::pair(g0.major, g0.minor), std::pair(9, 0));
  EXPECT_EQ(g0.arch, 9u) << "NVML_DEVICE_ARCH_HOPPER from 9.0";
  EXPECT_EQ(g0.brand, 14) << "NVML_BRAND_NVIDIA";

  auto g1 = identity(device(1));
  EXPECT_EQ(std::pair(g1.major, g1.minor), std::pair(8, 6));
  EXPECT_EQ(g1.arch, 7u) << "NVML_DEVICE_ARCH_AMPERE";
  EXPECT_EQ(g1.brand, 5) << "NVML_BRAND_GEFORCE";

  auto g2 = identity(device(2));
  EXPECT_EQ(std::pair(g2.major, g2.minor), std::pair(8, 0)) << "documented default";
  EXPECT_EQ(g2.arch, 7u);

  auto g3 = identity(device(3));
  EXPECT_EQ(std::pair(g3.major, g3.minor), std::pair(8, 9));
  EXPECT_EQ(g3.arch, 10u) << "NVML_DEVICE_ARCH_BLACKWELL";
  EXPECT_EQ(g3.brand, 2) << "NVML_BRAND_TESLA";
}

TEST_F(MockNvmlAbiTest, BadIdentityFieldsFailInit) {
  for (auto [field, value] : std::initializer_list<std::pair<const char*, nlohmann::json>>{
           {"cuda_compute_capability", "8.0"},
           {"cuda_compute_capability", {8}},
           {"architecture", "fermi"},
           {"brand", "radeon"},
           {"mig_mode", "enabled"}}) {
    auto cfg = test::mock_gpus(1);
    cfg["gpus"][0][field] = value;
    EXPECT_EQ(init(cfg), nvml::ERROR_UNKNOWN) << field << "=" << value.dump();
  }
}

// A GPU without MIG, as NVML answers for one (docs/mock-nvml.md).
TEST_F(MockNvmlAbiTest, MigIsReportedUnsupportedOnANonMigGpu) {
  ASSERT_EQ(init(test::mock_gpus(1)), nvml::SUCCESS);
  nvmlDevice_t d = device(0);
  unsigned current = 7, pending = 7, count = 7, is_mig = 7, id = 7;
  nvmlDevice_t out = nullptr;
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMigMode", d, &current, &pending),
            nvml::ERROR_NOT_SUPPORTED);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMaxMigDeviceCount", d, &count), nvml::SUCCESS);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceIsMigDeviceHandle", d, &is_mig), nvml::SUCCESS);
  EXPECT_EQ(is_mig, 0u);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMigDeviceHandleByIndex", d, 0u, &out),
            nvml::ERROR_NOT_SUPPORTED);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", d, &out),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceId", d, &id), nvml::ERROR_NOT_SUPPORTED);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetComputeInstanceId", d, &id),
            nvml::ERROR_NOT_SUPPORTED);
  alignas(8) unsigned char buf[512] = {};
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetAttributes_v2", d, static_cast<void*>(buf)),
            nvml::ERROR_NOT_SUPPORTED);
  EXPECT_EQ(
      call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceProfileInfo", d, 0u, static_cast<void*>(buf)),
      nvml::ERROR_NOT_SUPPORTED);
  void* gi = nullptr;
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceById", d, 1u, &gi),
            nvml::ERROR_NOT_SUPPORTED);
  // No instance handle is ever given out, so any one passed in is invalid.
  void* bogus = buf;
  EXPECT_EQ(call<nvmlReturn_t>("nvmlGpuInstanceGetInfo", bogus, static_cast<void*>(buf)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlGpuInstanceGetComputeInstanceById", bogus, 0u, &gi),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlGpuInstanceGetComputeInstanceProfileInfo", bogus, 0u, 0u,
                               static_cast<void*>(buf)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlComputeInstanceGetInfo_v2", bogus, static_cast<void*>(buf)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::count(std::begin(buf), std::end(buf), 0), static_cast<long>(sizeof buf))
      << "an error answer wrote into the caller's struct";
}

TEST_F(MockNvmlAbiTest, AMigCapableGpuWithMigOffReportsDisabled) {
  auto cfg = test::mock_gpus(1);
  cfg["gpus"][0]["mig_mode"] = "disabled";
  ASSERT_EQ(init(cfg), nvml::SUCCESS);
  unsigned current = 7, pending = 7, count = 7;
  nvmlDevice_t out = nullptr;
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMigMode", device(0), &current, &pending),
            nvml::SUCCESS);
  EXPECT_EQ(current, 0u) << "NVML_DEVICE_MIG_DISABLE";
  EXPECT_EQ(pending, 0u);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMaxMigDeviceCount", device(0), &count), nvml::SUCCESS);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMigDeviceHandleByIndex", device(0), 0u, &out),
            nvml::ERROR_NOT_FOUND);
}

TEST_F(MockNvmlAbiTest, ErrorStringNamesEveryReturnCodeWithOneStaticString) {
  ASSERT_EQ(init(test::mock_gpus(1)), nvml::SUCCESS);
  std::map<nvmlReturn_t, std::pair<const char*, std::string>> seen;
  std::set<std::string> texts;
  for (nvmlReturn_t code : kCodes) {
    const char* s = call<const char*>("nvmlErrorString", code);
    ASSERT_NE(s, nullptr) << code;
    EXPECT_EQ(call<const char*>("nvmlErrorString", code), s) << "one pointer per code: " << code;
    if (code != 999) {
      EXPECT_STRNE(s, "Unknown Error") << code << " has no text of its own";
    }
    texts.insert(s);
    seen[code] = {s, s};
  }
  EXPECT_EQ(texts.size(), std::size(kCodes)) << "two codes share a text";
  EXPECT_STREQ(call<const char*>("nvmlErrorString", 12345), "Unknown Error");
  EXPECT_STREQ(call<const char*>("nvmlErrorString", -1), "Unknown Error");
  call<nvmlReturn_t>("nvmlShutdown");
  --m_inits;
  // The driver's strings are static: the same pointer, unchanged, after shutdown.
  for (const auto& [code, text] : seen) {
    EXPECT_EQ(call<const char*>("nvmlErrorString", code), text.first) << code;
    EXPECT_STREQ(text.first, text.second.c_str()) << code;
  }
}

// Invalid handles and NULL outputs get INVALID_ARGUMENT, and nothing answers before init.
TEST_F(MockNvmlAbiTest, NewQueriesRejectBadHandlesNullPointersAndNoInit) {
  int major = 0, minor = 0, brand = 0;
  unsigned u = 0, v = 0;
  nvmlDevice_t out = nullptr;
  unsigned char buf[512] = {};
  void* gi = nullptr;
  auto device_queries = [&](nvmlDevice_t d) {
    return std::vector<std::pair<const char*, nvmlReturn_t>>{
        {"nvmlDeviceGetCudaComputeCapability",
         call<nvmlReturn_t>("nvmlDeviceGetCudaComputeCapability", d, &major, &minor)},
        {"nvmlDeviceGetArchitecture", call<nvmlReturn_t>("nvmlDeviceGetArchitecture", d, &u)},
        {"nvmlDeviceGetBrand", call<nvmlReturn_t>("nvmlDeviceGetBrand", d, &brand)},
        {"nvmlDeviceGetMigMode", call<nvmlReturn_t>("nvmlDeviceGetMigMode", d, &u, &v)},
        {"nvmlDeviceGetMaxMigDeviceCount",
         call<nvmlReturn_t>("nvmlDeviceGetMaxMigDeviceCount", d, &u)},
        {"nvmlDeviceGetMigDeviceHandleByIndex",
         call<nvmlReturn_t>("nvmlDeviceGetMigDeviceHandleByIndex", d, 0u, &out)},
        {"nvmlDeviceIsMigDeviceHandle", call<nvmlReturn_t>("nvmlDeviceIsMigDeviceHandle", d, &u)},
        {"nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
         call<nvmlReturn_t>("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", d, &out)},
        {"nvmlDeviceGetGpuInstanceId", call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceId", d, &u)},
        {"nvmlDeviceGetComputeInstanceId",
         call<nvmlReturn_t>("nvmlDeviceGetComputeInstanceId", d, &u)},
        {"nvmlDeviceGetAttributes_v2",
         call<nvmlReturn_t>("nvmlDeviceGetAttributes_v2", d, static_cast<void*>(buf))},
        {"nvmlDeviceGetGpuInstanceProfileInfo",
         call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceProfileInfo", d, 0u, static_cast<void*>(buf))},
        {"nvmlDeviceGetGpuInstanceById",
         call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceById", d, 0u, &gi)},
    };
  };
  auto bogus = reinterpret_cast<nvmlDevice_t>(buf);  // never handed out by the mock

  for (auto [fn, rc] : device_queries(bogus)) EXPECT_EQ(rc, nvml::ERROR_UNINITIALIZED) << fn;
  ASSERT_EQ(init(test::mock_gpus(1)), nvml::SUCCESS);
  for (auto [fn, rc] : device_queries(bogus)) EXPECT_EQ(rc, nvml::ERROR_INVALID_ARGUMENT) << fn;
  for (auto [fn, rc] : device_queries(nullptr)) EXPECT_EQ(rc, nvml::ERROR_INVALID_ARGUMENT) << fn;

  nvmlDevice_t d = device(0);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetCudaComputeCapability", d, &major,
                               static_cast<int*>(nullptr)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetCudaComputeCapability", d, static_cast<int*>(nullptr),
                               &minor),
            nvml::ERROR_INVALID_ARGUMENT);
  for (const char* fn : {"nvmlDeviceGetArchitecture", "nvmlDeviceGetMaxMigDeviceCount",
                         "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetGpuInstanceId",
                         "nvmlDeviceGetComputeInstanceId"})
    EXPECT_EQ(call<nvmlReturn_t>(fn, d, static_cast<unsigned*>(nullptr)),
              nvml::ERROR_INVALID_ARGUMENT)
        << fn;
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetBrand", d, static_cast<int*>(nullptr)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMigMode", d, &u, static_cast<unsigned*>(nullptr)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetMigDeviceHandleByIndex", d, 0u,
                               static_cast<nvmlDevice_t*>(nullptr)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetAttributes_v2", d, static_cast<void*>(nullptr)),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceProfileInfo", d, 0u, static_cast<void*>(nullptr)),
      nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetGpuInstanceById", d, 0u, static_cast<void**>(nullptr)),
            nvml::ERROR_INVALID_ARGUMENT);
}

// The injection knobs reach the new entry points like the old ones.
TEST_F(MockNvmlAbiTest, InjectedFailuresAndLostGpusReachTheNewQueries) {
  auto cfg = test::mock_gpus(2);
  cfg["fail"]["nvmlDeviceGetCudaComputeCapability"] = nvml::ERROR_UNKNOWN;
  cfg["gpus"][1]["lost"] = true;
  ASSERT_EQ(init(cfg), nvml::SUCCESS);
  int major = 0, minor = 0;
  unsigned arch = 0;
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetCudaComputeCapability", device(0), &major, &minor),
            nvml::ERROR_UNKNOWN);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetArchitecture", device(1), &arch),
            nvml::ERROR_GPU_IS_LOST);
}

// go-gpuallocator walks links 0..NVML_NVLINK_MAX_LINKS-1 and fails on anything but SUCCESS or
// NOT_SUPPORTED, so a link the GPU lacks must read NOT_SUPPORTED (docs/mock-nvml.md).
TEST_F(MockNvmlAbiTest, AbsentNvLinksAreNotSupportedUpToTheHeaderLimit) {
  auto cfg = test::mock_gpus(2);
  cfg["gpus"][0]["nvlinks"] = {"00000000:11:00.0"};
  ASSERT_EQ(init(cfg), nvml::SUCCESS);
  nvmlDevice_t d = device(0);
  nvmlEnableState_t active = 0;
  nvmlPciInfo_t pci{};
  ASSERT_EQ(call<nvmlReturn_t>("nvmlDeviceGetNvLinkState", d, 0u, &active), nvml::SUCCESS);
  EXPECT_EQ(active, nvml::FEATURE_ENABLED);
  ASSERT_EQ(call<nvmlReturn_t>("nvmlDeviceGetNvLinkRemotePciInfo_v2", d, 0u, &pci), nvml::SUCCESS);
  EXPECT_STREQ(pci.busId, "00000000:11:00.0");
  for (unsigned link = 1; link < nvml::kMaxNvLinks; ++link) {
    EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetNvLinkState", d, link, &active),
              nvml::ERROR_NOT_SUPPORTED)
        << link;
    EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetNvLinkRemotePciInfo_v2", d, link, &pci),
              nvml::ERROR_NOT_SUPPORTED)
        << link;
  }
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetNvLinkState", d, nvml::kMaxNvLinks, &active),
            nvml::ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(call<nvmlReturn_t>("nvmlDeviceGetNvLinkState", device(1), 0u, &active),
            nvml::ERROR_NOT_SUPPORTED)
      << "a GPU without NVLink";
}
