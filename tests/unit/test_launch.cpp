// gpufence launch: the pure parts on literal text, and the real binary on a fake root.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "common/file.hpp"
#include "launch/launch.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {
const std::string kA = "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01";
const std::string kB = "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2";
}  // namespace

TEST(Launch, AllocatedUuidsFromEnvOrMarkers) {
  EXPECT_EQ(allocated_uuids({{"CUDA_VISIBLE_DEVICES", kB}}, {}).value(),
            (std::vector<std::string>{kB}));
  EXPECT_EQ(allocated_uuids({{"NVIDIA_VISIBLE_DEVICES", kA + "," + kB}}, {}).value(),
            (std::vector<std::string>{kA, kB}));
  EXPECT_EQ(allocated_uuids({{"NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices"}},
                            {kB, "imex"})
                .value(),
            (std::vector<std::string>{kB}));
  EXPECT_EQ(
      allocated_uuids({{"NVIDIA_VISIBLE_DEVICES", "all"}, {"CUDA_VISIBLE_DEVICES", "0"}}, {kA})
          .value(),
      (std::vector<std::string>{kA}))
      << "'all' and indices say nothing about the allocation";
  auto none = allocated_uuids({{"NVIDIA_VISIBLE_DEVICES", "all"}}, {});
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no allocated GPU found"), std::string::npos);
}

TEST(Launch, RewritesGpuIdsKeepingEverythingElse) {
  std::string cfg =
      "[application]\nenable-perf-measurement=1\n\n[source0]\ngpu-id=1\n[primary-gie]\n  gpu-id = "
      "1 # was node GPU 1\nconfig-file=pgie.txt\n#gpu-id=5\n";
  auto one = rewrite_gpu_ids(cfg, 1, "ds.txt");
  ASSERT_TRUE(one) << one.error().message;
  EXPECT_EQ(one->changed, 2);
  EXPECT_EQ(one->text,
            "[application]\nenable-perf-measurement=1\n\n[source0]\ngpu-id=0\n[primary-gie]\n  "
            "gpu-id=0\nconfig-file=pgie.txt\n#gpu-id=5\n");
  EXPECT_EQ(one->referenced, (std::vector<std::string>{"pgie.txt"}));
  EXPECT_EQ(rewrite_gpu_ids(cfg, 2, "ds.txt")->changed, 0)
      << "with two GPUs gpu-id=1 is the second";
  auto past = rewrite_gpu_ids("[sink0]\ngpu-id=3\n", 2, "ds.txt");
  ASSERT_FALSE(past);
  EXPECT_NE(
      past.error().message.find("ds.txt:2: gpu-id=3 but the container was allocated 2 GPU(s)"),
      std::string::npos);
  EXPECT_FALSE(rewrite_gpu_ids("gpu-id=x\n", 1, "ds.txt"));
  EXPECT_EQ(rename_config_refs("a=1\n  config-file=pgie.txt\n", {{"pgie.txt", "/tmp/0-pgie.txt"}}),
            "a=1\n  config-file=/tmp/0-pgie.txt\n");
}

class LaunchBinary : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(m_root / "dev");
    m_dir.write("app/ds.txt",
                "[source0]\ngpu-id=1\n[primary-gie]\ngpu-id=1\nconfig-file=pgie.txt\n");
    m_dir.write("app/pgie.txt", "[property]\ngpu-id=1\n");
  }
  void node(unsigned minor) {
    ASSERT_EQ(::mknod((m_root / "dev" / ("nvidia" + std::to_string(minor))).c_str(), S_IFCHR | 0666,
                      makedev(195, minor)),
              0);
  }
  test::CommandResult launch(std::vector<std::string> extra, const std::vector<std::string>& env) {
    std::vector<std::string> argv = {test::bin_path("gpufence"), "--host-root", m_root.string(),
                                     "launch"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::run_command(argv, env);
  }
  test::TempDir m_dir;
  std::filesystem::path m_root = m_dir / "root";
};

TEST_F(LaunchBinary, RewritesConfigsPinsCudaAndExecs) {
  node(1);
  auto app = (m_dir / "app/ds.txt").string();
  auto r = launch(
      {"--config", app, "--", "/bin/sh", "-c",
       "echo CVD=$CUDA_VISIBLE_DEVICES; cat \"$0\" " + (m_dir / "app/pgie.txt").string(), app},
      {"NVIDIA_VISIBLE_DEVICES=" + kB, "CUDA_VISIBLE_DEVICES="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("CVD=" + kB), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("gpu-id=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[property]\ngpu-id=0"), std::string::npos)
      << "the nvinfer config it names is rewritten too";
  EXPECT_NE(r.err.find("rewrote 3 gpu-id key(s)"), std::string::npos) << r.err;
}

TEST_F(LaunchBinary, RefusesWhenItCanOpenMoreThanItWasGiven) {
  node(0);
  node(1);
  auto r = launch({"--", "/bin/true"}, {"CUDA_VISIBLE_DEVICES=" + kB});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("can open 2 GPUs but was allocated 1"), std::string::npos) << r.err;
  EXPECT_EQ(
      launch({"--allow-extra-gpus", "--", "/bin/true"}, {"CUDA_VISIBLE_DEVICES=" + kB}).exit_code,
      0);
}

TEST_F(LaunchBinary, NoAllocationIsAClearError) {
  auto r = launch({"--", "/bin/true"}, {"NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES="});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no allocated GPU found"), std::string::npos);
}

TEST_F(LaunchBinary, ReadOnlyConfigIsCopiedAndTheCopyPassed) {
  auto ro = m_dir / "ro";
  std::filesystem::create_directories(ro);
  if (::mount("tmpfs", ro.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "needs root to mount a read-only tmpfs";
  ASSERT_TRUE(write_file_atomic(ro / "ds.txt", "[source0]\ngpu-id=1\n"));
  ASSERT_EQ(::mount(nullptr, ro.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0);
  node(1);
  auto r = launch({"--config", (ro / "ds.txt").string(), "--", "/bin/sh", "-c", "cat \"$0\"",
                   (ro / "ds.txt").string()},
                  {"CUDA_VISIBLE_DEVICES=" + kB, "TMPDIR=" + m_dir.path().string()});
  ::umount(ro.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[source0]\ngpu-id=0\n") << "the app got the rewritten copy";
  EXPECT_NE(r.err.find("read-only configs copied"), std::string::npos);
}
