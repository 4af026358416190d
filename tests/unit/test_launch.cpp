// gpufence launch: the pure parts on literal text, and the real binary on a fake root.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "common/file.hpp"
#include "launch/config_walk.hpp"
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

TEST(Launch, DisagreeingSourcesAreRefusedNamingBoth) {
  auto env_vs_env =
      allocated_uuids({{"CUDA_VISIBLE_DEVICES", kA}, {"NVIDIA_VISIBLE_DEVICES", kB}}, {});
  ASSERT_FALSE(env_vs_env) << "the old code took CUDA_VISIBLE_DEVICES and ignored the rest";
  EXPECT_NE(env_vs_env.error().message.find("CUDA_VISIBLE_DEVICES = " + kA), std::string::npos)
      << env_vs_env.error().message;
  EXPECT_NE(env_vs_env.error().message.find("NVIDIA_VISIBLE_DEVICES = " + kB), std::string::npos);
  auto env_vs_markers = allocated_uuids({{"NVIDIA_VISIBLE_DEVICES", kA}}, {kB});
  ASSERT_FALSE(env_vs_markers);
  EXPECT_NE(env_vs_markers.error().message.find("/var/run/nvidia-container-devices = " + kB),
            std::string::npos)
      << env_vs_markers.error().message;
  auto subset = allocated_uuids({{"CUDA_VISIBLE_DEVICES", kA}}, {kA, kB});
  EXPECT_FALSE(subset) << "one GPU of two is not the allocation";
  // Agreement: the same GPUs in another order, or a unique prefix as CUDA accepts.
  EXPECT_EQ(allocated_uuids({{"NVIDIA_VISIBLE_DEVICES", kB + "," + kA}}, {kA, kB}).value(),
            (std::vector<std::string>{kB, kA}));
  EXPECT_EQ(allocated_uuids({{"CUDA_VISIBLE_DEVICES", kB.substr(0, 12)},
                             {"NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=" + kB}},
                            {kB})
                .value(),
            (std::vector<std::string>{kB.substr(0, 12)}));
}

TEST(Launch, RewritesOnlyTheValuesThatChange) {
  std::string cfg =
      "[application]\nenable-perf-measurement=1\n\n[source0]\ngpu-id=1\n[primary-gie]\n  gpu-id = "
      "1 # was node GPU 1\nconfig-file=pgie.txt\n#gpu-id=5\n[osd]\ngpu-id=0  # already right\n"
      "[sink0]\r\ngpu-id=1\r\n";
  auto one = rewrite_gpu_ids(cfg, 1, "ds.txt");
  ASSERT_TRUE(one) << one.error().message;
  EXPECT_EQ(one->changed, 3);
  EXPECT_EQ(one->text,
            "[application]\nenable-perf-measurement=1\n\n[source0]\ngpu-id=0\n[primary-gie]\n  "
            "gpu-id = 0 # was node GPU 1\nconfig-file=pgie.txt\n#gpu-id=5\n[osd]\ngpu-id=0  # "
            "already right\n[sink0]\r\ngpu-id=0\r\n")
      << "spacing, trailing comments and CRLF kept byte for byte";
  EXPECT_EQ(one->referenced, (std::vector<std::string>{"pgie.txt"}));
  auto two = rewrite_gpu_ids(cfg, 2, "ds.txt");
  ASSERT_TRUE(two);
  EXPECT_EQ(two->changed, 0) << "with two GPUs gpu-id=1 is the second";
  EXPECT_EQ(two->text, cfg) << "nothing changes: the file is the same bytes";
  EXPECT_EQ(rewrite_gpu_ids("gpu-id=0  # c\n", 1, "ds.txt")->text, "gpu-id=0  # c\n");
  auto past = rewrite_gpu_ids("[sink0]\ngpu-id=3\n", 2, "ds.txt");
  ASSERT_FALSE(past);
  EXPECT_NE(
      past.error().message.find("ds.txt:2: gpu-id=3 but the container was allocated 2 GPU(s)"),
      std::string::npos);
  EXPECT_FALSE(rewrite_gpu_ids("gpu-id=x\n", 1, "ds.txt"));
  EXPECT_EQ(rename_config_refs("a=1\n  config-file = pgie.txt # nvinfer\n",
                               {{"pgie.txt", "/tmp/0-pgie.txt"}}),
            "a=1\n  config-file = /tmp/0-pgie.txt # nvinfer\n");
}

TEST(Launch, RewritesYamlConfigsInPlace) {
  EXPECT_EQ(config_format("/opt/pgie.yml"), ConfigFormat::yaml);
  EXPECT_EQ(config_format("pgie.yaml"), ConfigFormat::yaml);
  EXPECT_EQ(config_format("pgie.txt"), ConfigFormat::key_file);
  const std::string block =
      "# nvinfer config\nproperty:\n  gpu-id:   1   # node GPU 1\n  net-scale-factor: "
      "0.0039215697906911373\n  batch-size: 1\n\nclass-attrs-all:\n  pre-cluster-threshold: 0.2\n";
  auto b = rewrite_gpu_ids_yaml(block, 1, "pgie.yml");
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(b->changed, 1);
  EXPECT_EQ(b->text,
            "# nvinfer config\nproperty:\n  gpu-id:   0   # node GPU 1\n  net-scale-factor: "
            "0.0039215697906911373\n  batch-size: 1\n\nclass-attrs-all:\n  pre-cluster-threshold: "
            "0.2\n");
  auto flow = rewrite_gpu_ids_yaml("property: {gpu-id: 1, batch-size: 4}  # flow\n", 1, "p.yml");
  ASSERT_TRUE(flow) << flow.error().message;
  EXPECT_EQ(flow->text, "property: {gpu-id: 0, batch-size: 4}  # flow\n");
  auto quoted = rewrite_gpu_ids_yaml("property:\n  gpu-id: \"1\"\n", 1, "p.yml");
  ASSERT_TRUE(quoted) << quoted.error().message;
  EXPECT_EQ(quoted->text, "property:\n  gpu-id: \"0\"\n");
  // deepstream-app YAML: gpu-id in several groups, nvinfer named by config-file(-path).
  auto app = rewrite_gpu_ids_yaml(
      "source0:\n  gpu-id: 1\nprimary-gie:\n  gpu-id: 1\n  config-file-path: pgie.yml\n", 1,
      "app.yml");
  ASSERT_TRUE(app) << app.error().message;
  EXPECT_EQ(app->changed, 2);
  EXPECT_EQ(app->referenced, (std::vector<std::string>{"pgie.yml"}));
  EXPECT_EQ(rewrite_gpu_ids_yaml(block, 2, "pgie.yml")->text, block) << "1 of 2 stays";
  auto past = rewrite_gpu_ids_yaml("property:\n  gpu-id: 3\n", 2, "pgie.yml");
  ASSERT_FALSE(past);
  EXPECT_NE(past.error().message.find("pgie.yml:2: gpu-id=3"), std::string::npos)
      << past.error().message;
  auto list = rewrite_gpu_ids_yaml("property:\n  gpu-id: [1]\n", 1, "pgie.yml");
  ASSERT_FALSE(list);
  EXPECT_NE(list.error().message.find("gpu-id is not a single value"), std::string::npos);
  auto literal = rewrite_gpu_ids_yaml("property:\n  gpu-id: >-\n    1\n", 1, "pgie.yml");
  ASSERT_FALSE(literal) << "a block scalar is not edited at a guessed offset";
  EXPECT_NE(literal.error().message.find("rewrite it by hand"), std::string::npos)
      << literal.error().message;
  auto escaped = rewrite_gpu_ids_yaml("property:\n  gpu-id: \"\\x31\"\n", 1, "pgie.yml");
  ASSERT_FALSE(escaped) << "\\x31 is 1, but not spelled 1 in the text";
  EXPECT_NE(escaped.error().message.find("pgie.yml:2"), std::string::npos);
  EXPECT_FALSE(rewrite_gpu_ids_yaml("property: {gpu-id: 1\n", 1, "pgie.yml")) << "malformed";
  auto renamed = rename_config_refs_yaml("primary-gie:\n  config-file: pgie.yml  # nvinfer\n",
                                         {{"pgie.yml", "/tmp/0-pgie.yml"}}, "app.yml");
  ASSERT_TRUE(renamed);
  EXPECT_EQ(*renamed, "primary-gie:\n  config-file: /tmp/0-pgie.yml  # nvinfer\n");
}

class LaunchBinary : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to mknod fake GPU nodes (195:N)";
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

TEST_F(LaunchBinary, FollowsIntoYamlNvinferConfigs) {
  node(1);
  m_dir.write("app/ds.txt", "[primary-gie]\ngpu-id=1  # node GPU\nconfig-file=pgie.yml\n");
  m_dir.write("app/pgie.yml", "property:\n  gpu-id: 1 # node GPU\n  batch-size: 4\n");
  auto app = (m_dir / "app/ds.txt").string();
  auto r = launch({"--config", app, "--", "/bin/true"}, {"CUDA_VISIBLE_DEVICES=" + kB});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(app).value(), "[primary-gie]\ngpu-id=0  # node GPU\nconfig-file=pgie.yml\n");
  EXPECT_EQ(read_file(m_dir / "app/pgie.yml").value(),
            "property:\n  gpu-id: 0 # node GPU\n  batch-size: 4\n");
}

TEST_F(LaunchBinary, DisagreeingAllocationIsRefused) {
  node(1);
  auto r =
      launch({"--", "/bin/true"}, {"CUDA_VISIBLE_DEVICES=" + kA, "NVIDIA_VISIBLE_DEVICES=" + kB});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("sources disagree"), std::string::npos) << r.err;
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

// --- The config walk (launch/config_walk.hpp) over files in memory: no root, no mounts ---

namespace {

// Files in a map; `read_only` ones refuse replacement as a ConfigMap's mount does (EROFS).
class FakeFiles final : public ConfigFiles {
 public:
  std::map<std::string, std::string> files;
  std::set<std::string> read_only;
  std::vector<std::string> reads;
  Result<std::string> read(const std::filesystem::path& path) override {
    reads.push_back(path.string());
    auto it = files.find(path.string());
    if (it == files.end()) return fail(Errc::not_found, "open ", path.string(), ": no such file");
    return it->second;
  }
  bool exists(const std::filesystem::path& path) override { return files.contains(path.string()); }
  Status replace(const std::filesystem::path& path, const std::string& text) override {
    if (read_only.contains(path.string()))
      return fail(Errc::io, "rename over ", path.string(), ": Read-only file system");
    files[path.string()] = text;
    return {};
  }
  Status write_copy(const std::filesystem::path& path, const std::string& text) override {
    files[path.string()] = text;
    return {};
  }
};

}  // namespace

// The seed's layout: deepstream-app's config in a ConfigMap (read-only) names an nvinfer config in
// another, read-only too. Both get copies; the parent's copy names the child's copy, the app's
// argv names the parent's copy, and the originals stay as they were.
TEST(LaunchConfigs, ReadOnlyConfigsAreCopiedAndEveryReferencePointsAtTheCopies) {
  FakeFiles fs;
  fs.files["/cfg/ds.txt"] = "[primary-gie]\ngpu-id=1\nconfig-file=pgie.txt\n";
  fs.files["/cfg/pgie.txt"] = "[property]\ngpu-id=1\n";
  fs.read_only = {"/cfg/ds.txt", "/cfg/pgie.txt"};
  auto r = rewrite_configs({"/cfg/ds.txt"}, 1, "/tmp/gl", fs);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->rewritten, 2);
  ASSERT_EQ(r->copies.size(), 2u);
  const auto child = r->copies.at("/cfg/pgie.txt"), parent = r->copies.at("/cfg/ds.txt");
  EXPECT_EQ(child, "/tmp/gl/0-pgie.txt") << "children first";
  EXPECT_EQ(parent, "/tmp/gl/1-ds.txt");
  EXPECT_EQ(fs.files[child], "[property]\ngpu-id=0\n");
  EXPECT_EQ(fs.files[parent], "[primary-gie]\ngpu-id=0\nconfig-file=/tmp/gl/0-pgie.txt\n");
  EXPECT_EQ(fs.files["/cfg/ds.txt"], "[primary-gie]\ngpu-id=1\nconfig-file=pgie.txt\n");
  EXPECT_EQ(point_at_copies({"deepstream-app", "-c", "/cfg/ds.txt"}, *r),
            (std::vector<std::string>{"deepstream-app", "-c", parent}));
}

TEST(LaunchConfigs, WritableConfigsAreRewrittenInPlaceAndAWritableParentNamesAReadOnlyChildsCopy) {
  FakeFiles fs;
  fs.files["/app/ds.txt"] = "[primary-gie]\ngpu-id=1\nconfig-file=/cfg/pgie.txt\n";
  fs.files["/cfg/pgie.txt"] = "[property]\ngpu-id=1\n";
  fs.read_only = {"/cfg/pgie.txt"};
  auto r = rewrite_configs({"/app/ds.txt"}, 1, "/tmp/gl", fs);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->copies.size(), 1u);
  EXPECT_EQ(fs.files["/app/ds.txt"], "[primary-gie]\ngpu-id=0\nconfig-file=/tmp/gl/0-pgie.txt\n");
  EXPECT_EQ(point_at_copies({"app", "/app/ds.txt"}, *r),
            (std::vector<std::string>{"app", "/app/ds.txt"}));
}

// Each file once (a config naming itself, or two naming each other), at most 4 levels down, and
// a reference to a missing file is DeepStream's to report, not a refusal.
TEST(LaunchConfigs, LoopsDepthAndMissingFilesEndTheWalk) {
  FakeFiles fs;
  fs.files["/c/a.txt"] = "[x]\ngpu-id=1\nconfig-file=b.txt\nconfig-file=gone.txt\n";
  fs.files["/c/b.txt"] = "[x]\nconfig-file=a.txt\nconfig-file=b.txt\n";
  for (int i = 0; i < 7; ++i)
    fs.files["/d/" + std::to_string(i) + ".txt"] =
        "[x]\ngpu-id=1\nconfig-file=" + std::to_string(i + 1) + ".txt\n";
  auto r = rewrite_configs({"/c/a.txt", "/d/0.txt"}, 1, "/tmp/gl", fs);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(std::count(fs.reads.begin(), fs.reads.end(), "/c/a.txt"), 1);
  EXPECT_EQ(std::count(fs.reads.begin(), fs.reads.end(), "/c/b.txt"), 1);
  EXPECT_EQ(std::count(fs.reads.begin(), fs.reads.end(), "/c/gone.txt"), 0);
  EXPECT_EQ(fs.files["/d/4.txt"], "[x]\ngpu-id=0\nconfig-file=5.txt\n") << "depth 4 is read";
  EXPECT_EQ(fs.files["/d/5.txt"], "[x]\ngpu-id=1\nconfig-file=6.txt\n") << "depth 5 is not";
  EXPECT_EQ(r->rewritten, 1 + 5);
}

// With two GPUs a gpu-id past the end cannot be rewritten: the error names the file, and nothing
// that came after it is touched.
TEST(LaunchConfigs, AnIndexPastTheAllocationStopsTheWalkNamingTheFile) {
  FakeFiles fs;
  fs.files["/c/a.txt"] = "[x]\ngpu-id=5\n";
  fs.files["/c/b.txt"] = "[x]\ngpu-id=1\n";
  auto r = rewrite_configs({"/c/a.txt", "/c/b.txt"}, 2, "/tmp/gl", fs);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("/c/a.txt"), std::string::npos) << r.error().message;
  EXPECT_EQ(fs.files["/c/b.txt"], "[x]\ngpu-id=1\n");
}
