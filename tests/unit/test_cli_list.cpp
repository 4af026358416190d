// `gpufence list` as a user runs it: the real binary, the mock driver library.
#include <gtest/gtest.h>

#include "support/test_support.hpp"

using namespace gpufence;

namespace {

std::vector<std::string> mock_env(const std::string& config) {
  return {"MOCK_NVML_CONFIG=" + config, "GPUFENCE_NVML_LIBRARY=" + test::mock_nvml_library()};
}

}  // namespace

TEST(CliList, JsonListsBothSeedGpusWithUuidsAndMinors) {
  auto r =
      test::run_command({test::bin_path("gpufence"), "list", "--json"},
                        mock_env(test::source_path("tools/mock-nvml/examples/two-rtx3080.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["schema"], "gpufence.list/v1");
  ASSERT_EQ(doc["gpus"].size(), 2u);
  EXPECT_EQ(doc["gpus"][0]["uuid"], "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01");
  EXPECT_EQ(doc["gpus"][1]["uuid"], "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2");
  EXPECT_EQ(doc["gpus"][0]["minor"], 0);
  EXPECT_EQ(doc["gpus"][1]["minor"], 1);
  EXPECT_EQ(doc["gpus"][0]["processes"].size(), 2u);
  EXPECT_EQ(doc["gpus"][0]["processes"][0]["pid"], 4211);
  EXPECT_EQ(doc["gpus"][1]["pci_bus_id"], "00000000:02:00.0");
}

TEST(CliList, TextLooksLikeNvidiaSmiL) {
  auto r =
      test::run_command({test::bin_path("gpufence"), "list"},
                        mock_env(test::source_path("tools/mock-nvml/examples/two-rtx3080.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("GPU 0: NVIDIA GeForce RTX 3080 (UUID: GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01)"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("minor 1 (/dev/nvidia1)"), std::string::npos);
}

TEST(CliList, NvmlLibraryFlagOverridesEnv) {
  auto r = test::run_command(
      {test::bin_path("gpufence"), "--nvml-library", "/nonexistent/libnvidia-ml.so.1", "list"},
      mock_env(test::source_path("tools/mock-nvml/examples/two-rtx3080.json")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot load NVML library /nonexistent/libnvidia-ml.so.1"),
            std::string::npos)
      << r.err;
}

TEST(CliList, FailsClearlyWithoutNvml) {
  auto r = test::run_command({test::bin_path("gpufence"), "list"},
                             {"GPUFENCE_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("gpufence list: cannot load NVML library"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(CliList, ZeroGpus) {
  test::TempDir dir;
  auto cfg = dir.write("nvml.json", test::mock_gpus(0).dump());
  auto r =
      test::run_command({test::bin_path("gpufence"), "list", "--json"}, mock_env(cfg.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["gpus"].empty());
}

TEST(CliList, GlobalFlagsWorkAfterTheSubcommand) {
  auto r = test::run_command({test::bin_path("gpufence"), "list", "--json", "--nvml-library", test::mock_nvml_library()},
                             {"MOCK_NVML_CONFIG=" + test::source_path("tools/mock-nvml/examples/two-rtx3080.json"),
                              "GPUFENCE_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["gpus"].size(), 2u);
}
