#include <gtest/gtest.h>

#include "gpu/driver_procfs.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {
// As a 550-series driver writes it (tabs and all).
constexpr const char* kInformation =
    "Model: \t\t NVIDIA GeForce RTX 3080\n"
    "IRQ:   \t\t 139\n"
    "GPU UUID: \t GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2\n"
    "Video BIOS: \t 94.02.42.00.a9\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 47 bits\n"
    "DMA Mask: \t 0x7fffffffffff\n"
    "Bus Location: \t 0000:3b:00.0\n"
    "Device Minor: \t 1\n"
    "GPU Excluded:\t No\n";
}  // namespace

TEST(DriverProcfs, ParsesTheInformationFile) {
  auto gpu = parse_driver_gpu_information(kInformation);
  ASSERT_TRUE(gpu) << gpu.error().message;
  EXPECT_EQ(gpu->name, "NVIDIA GeForce RTX 3080");
  EXPECT_EQ(gpu->uuid, "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2");
  EXPECT_EQ(gpu->pci_bus_id, "00000000:3B:00.0");
  EXPECT_EQ(gpu->minor, 1u);
}

TEST(DriverProcfs, MalformedFilesAreErrors) {
  EXPECT_FALSE(parse_driver_gpu_information(""));
  EXPECT_FALSE(parse_driver_gpu_information("GPU UUID: GPU-abc\n"));  // no minor
  auto bad_minor = parse_driver_gpu_information("GPU UUID: GPU-abc\nDevice Minor: x\n");
  ASSERT_FALSE(bad_minor);
  EXPECT_NE(bad_minor.error().message.find("Device Minor 'x'"), std::string::npos);
  EXPECT_FALSE(parse_driver_gpu_information("GPU UUID: abc\nDevice Minor: 0\n"));
}

TEST(DriverProcfs, ListsGpusInBusOrderOnAFakeRoot) {
  test::TempDir root;
  root.write("proc/driver/nvidia/gpus/0000:3b:00.0/information", kInformation);
  root.write("proc/driver/nvidia/gpus/0000:1a:00.0/information",
             "GPU UUID: \t GPU-aaaa\nBus Location: \t 0000:1a:00.0\nDevice Minor: \t 0\n");
  auto gpus = read_driver_gpus(HostFs(root.path()));
  ASSERT_TRUE(gpus) << gpus.error().message;
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].uuid, "GPU-aaaa");
  EXPECT_EQ((*gpus)[0].index, 0u);
  EXPECT_EQ((*gpus)[1].index, 1u);
  EXPECT_EQ((*gpus)[1].minor, 1u);

  auto none = read_driver_gpus(HostFs((root / "nothing").string()));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::not_found);

  root.write("proc/driver/nvidia/gpus/0000:5e:00.0/information", "garbage");
  auto bad = read_driver_gpus(HostFs(root.path()));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("0000:5e:00.0/information"), std::string::npos);
}
