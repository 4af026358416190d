#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "common/strings.hpp"
#include "runtime/config.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

TEST(RuntimeConfig, DefaultsAreTheSecureOnes) {
  auto cfg = parse_runtime_config("", "x.toml");
  ASSERT_TRUE(cfg);
  EXPECT_EQ(cfg->low_level_runtime, "runc");
  EXPECT_TRUE(cfg->trusts(Channel::cdi_annotations));
  EXPECT_TRUE(cfg->trusts(Channel::mount_markers));
  EXPECT_FALSE(cfg->trusts(Channel::envvar));
  EXPECT_EQ(cfg->all_devices_policy, AllDevicesPolicy::isolate);
  EXPECT_EQ(cfg->cdi_spec_dirs, (std::vector<std::string>{"/etc/cdi", "/var/run/cdi"}));
}

TEST(RuntimeConfig, TheShippedExampleParsesToTheDefaults) {
  std::ifstream in(test::source_path("deploy/runtime.toml"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  ASSERT_FALSE(text.empty());
  auto cfg = parse_runtime_config(text, "deploy/runtime.toml");
  ASSERT_TRUE(cfg) << cfg.error().message;
  RuntimeConfig defaults;
  EXPECT_EQ(cfg->low_level_runtime, defaults.low_level_runtime);
  EXPECT_EQ(cfg->log_file, defaults.log_file);
  EXPECT_EQ(cfg->trusted_channels, defaults.trusted_channels);
  EXPECT_EQ(cfg->control_nodes, defaults.control_nodes);
  EXPECT_EQ(cfg->cdi_spec_dirs, defaults.cdi_spec_dirs);
  EXPECT_EQ(cfg->annotation_prefixes, defaults.annotation_prefixes);
  EXPECT_EQ(cfg->procfs_gpus_dir, defaults.procfs_gpus_dir);
  EXPECT_TRUE(cfg->gpu_cdi_kinds.empty());
}

// [cdi] gpu_kinds names another allocator's CDI kinds; a malformed kind, or gpufence's own
// (whose names are GPU ids, read without listing), is an error naming the key.
TEST(RuntimeConfig, ListedGpuKindsAreCdiKinds) {
  auto cfg = parse_runtime_config(
      "[cdi]\ngpu_kinds = [\"k8s.gpu.nvidia.com/claim\", \"example.com/accel\"]\n", "r.toml");
  ASSERT_TRUE(cfg) << cfg.error().message;
  EXPECT_TRUE(cfg->is_listed_gpu_kind("k8s.gpu.nvidia.com/claim"));
  EXPECT_FALSE(cfg->is_listed_gpu_kind("k8s.gpu.nvidia.com/device"));
  for (const char* bad : {"claim", "k8s.gpu.nvidia.com/", "/gpu", "a b/c", "nvidia.com/gpu",
                          "gpufence.io/gpu", "vendor/class=x"}) {
    auto r = parse_runtime_config(cat("[cdi]\ngpu_kinds = [\"", bad, "\"]\n"), "r.toml");
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("cdi.gpu_kinds"), std::string::npos) << r.error().message;
  }
}

TEST(RuntimeConfig, EveryKey) {
  auto cfg = parse_runtime_config(R"(
[runtime]
low_level = "/usr/bin/crun"
[log]
file = ""
level = "debug"
[allocation]
trusted_channels = ["mount-markers", "envvar"]
privileged = "passthrough"
annotation_prefixes = ["cdi.k8s.io/", "example.com/"]
[devices]
root = "/host"
control_nodes = ["/dev/nvidiactl"]
nvml_library = "/opt/libnvidia-ml.so.1"
[cdi]
spec_dirs = ["/etc/cdi"]
[driver]
procfs_gpus_dir = "/fake/gpus"
)",
                                  "x.toml");
  ASSERT_TRUE(cfg) << cfg.error().message;
  EXPECT_EQ(cfg->low_level_runtime, "/usr/bin/crun");
  EXPECT_EQ(cfg->log_file, "");
  EXPECT_EQ(cfg->log_level, "debug");
  EXPECT_FALSE(cfg->trusts(Channel::cdi_annotations));
  EXPECT_TRUE(cfg->trusts(Channel::envvar));
  EXPECT_EQ(cfg->all_devices_policy, AllDevicesPolicy::passthrough);
  EXPECT_EQ(cfg->annotation_prefixes.size(), 2u);
  EXPECT_EQ(cfg->device_root, "/host");
  EXPECT_EQ(cfg->control_nodes.size(), 1u);
  EXPECT_EQ(cfg->nvml_library, "/opt/libnvidia-ml.so.1");
  EXPECT_EQ(cfg->cdi_spec_dirs.size(), 1u);
  EXPECT_EQ(cfg->procfs_gpus_dir, "/fake/gpus");
  EXPECT_FALSE(parse_runtime_config("[driver]\nprocfs_gpus_dir = \"relative\"\n", "r.toml"));
  // The runtime runs in the bundle directory: a relative log would be written there.
  auto rel = parse_runtime_config("[log]\nfile = \"rel.log\"\n", "r.toml");
  ASSERT_FALSE(rel);
  EXPECT_NE(rel.error().message.find("log.file"), std::string::npos) << rel.error().message;
}

TEST(RuntimeConfig, BadInputNamesFileAndKey) {
  auto broken = parse_runtime_config("[runtime\nlow_level = 1", "/etc/gpufence/runtime.toml");
  ASSERT_FALSE(broken);
  EXPECT_NE(broken.error().message.find("/etc/gpufence/runtime.toml:1:"), std::string::npos)
      << broken.error().message;

  auto typo = parse_runtime_config("[allocation]\ntrusted_chanels = []\n", "r.toml");
  ASSERT_FALSE(typo);
  EXPECT_NE(typo.error().message.find("unknown key 'allocation.trusted_chanels'"),
            std::string::npos);

  auto channel = parse_runtime_config("[allocation]\ntrusted_channels = [\"env\"]\n", "r.toml");
  ASSERT_FALSE(channel);
  EXPECT_NE(channel.error().message.find("unknown channel 'env'"), std::string::npos);

  auto type = parse_runtime_config("[runtime]\nlow_level = 3\n", "r.toml");
  ASSERT_FALSE(type);
  EXPECT_NE(type.error().message.find("runtime.low_level"), std::string::npos);

  EXPECT_FALSE(parse_runtime_config("[privileged]\nx = 1\n", "r.toml"));
  EXPECT_FALSE(parse_runtime_config("[allocation]\nprivileged = \"maybe\"\n", "r.toml"));
}

TEST(RuntimeConfig, LoadFromEnvPath) {
  test::TempDir dir;
  auto path = dir.write("runtime.toml", "[runtime]\nlow_level = \"/bin/true\"\n");
  ::setenv(kRuntimeConfigEnv, path.c_str(), 1);
  auto cfg = load_runtime_config();
  ASSERT_TRUE(cfg);
  EXPECT_EQ(cfg->low_level_runtime, "/bin/true");
  ::setenv(kRuntimeConfigEnv, (dir / "missing.toml").c_str(), 1);
  auto missing = load_runtime_config();
  ASSERT_FALSE(missing) << "an explicitly named config that is missing is an error";
  EXPECT_NE(missing.error().message.find("missing.toml"), std::string::npos);
  ::unsetenv(kRuntimeConfigEnv);
}

TEST(RuntimeConfig, OnlyTheSwitchableChannelsCanBeListed) {
  // The kubelet's device specs always count and "none" is no channel: listing either is an
  // error, not a silent no-op.
  for (const char* name : {"device-specs", "none", "CDI-annotations", ""}) {
    auto cfg = parse_runtime_config(
        std::string("[allocation]\ntrusted_channels = [\"") + name + "\"]\n", "x.toml");
    EXPECT_FALSE(cfg) << name;
  }
  auto nri = parse_runtime_config("[nri]\nstatus_file = \"relative.json\"\n", "x.toml");
  EXPECT_FALSE(nri) << "a status file must be an absolute path";
  auto off = parse_runtime_config("[nri]\nstatus_file = \"\"\n", "x.toml");
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_EQ(off->nri_status_file, "");
}

// [nri] node_agent_namespaces holds Kubernetes namespace names only (RFC 1123 labels).
TEST(RuntimeConfig, NodeAgentNamespacesAreNamespaceNames) {
  auto ok =
      parse_runtime_config("[nri]\nnode_agent_namespaces = [\"gpufence\", \"gpu-system\"]\n", "t");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->nri_node_agent_namespaces, (std::vector<std::string>{"gpufence", "gpu-system"}));
  for (const char* bad : {"\"\"", "\"Gpufence\"", "\"-x\"", "\"a/b\"", "\"a.b\""}) {
    auto r =
        parse_runtime_config(std::string("[nri]\nnode_agent_namespaces = [") + bad + "]\n", "t");
    EXPECT_FALSE(r) << bad;
  }
}
