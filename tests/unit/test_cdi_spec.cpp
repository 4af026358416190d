// CDI: the ld.so.cache reader, spec generation on fake driver trees, and validation.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <fstream>

#include "cdi/generate.hpp"
#include "cdi/ldcache.hpp"
#include "cdi/spec.hpp"
#include "common/file.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

std::string fixture(const std::string& name) {
  return read_file(test::source_path("tests/fixtures/cdi/" + name)).value();
}

std::vector<Gpu> two_gpus() {
  Gpu a;
  a.index = 0;
  a.minor = 0;
  a.uuid = "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01";
  Gpu b = a;
  b.index = 1;
  b.minor = 1;
  b.uuid = "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2";
  return {a, b};
}

// A driver installed under <root>/run/nvidia/driver as the GPU Operator does: the libraries the
// fixture ld.so.cache names (made by ldconfig from real ELF objects), nvidia-smi, GSP firmware,
// and /dev nodes on the host.
void make_operator_tree(const test::TempDir& root) {
  const std::string d = "run/nvidia/driver/";
  root.write(d + "etc/ld.so.cache", fixture("ld.so.cache"));
  for (std::string lib : {"libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-encode",
                          "libnvidia-ptxjitcompiler", "libnvidia-nvvm"}) {
    std::string so = lib == "libnvidia-nvvm" ? ".so.4" : ".so.1";
    root.write(d + "usr/lib/x86_64-linux-gnu/" + lib + ".so.550.54.15", "elf");
    std::filesystem::create_symlink(lib + ".so.550.54.15",
                                    root / (d + "usr/lib/x86_64-linux-gnu/" + lib + so));
  }
  root.write(d + "usr/bin/nvidia-smi", "#!/bin/sh\n");
  root.write(d + "lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", "fw");
  root.write(d + "run/nvidia-persistenced/socket", "");
  std::filesystem::create_directories(root / "dev");
  for (auto [name, minor] : {std::pair{"nvidia0", 0}, {"nvidia1", 1}, {"nvidiactl", 255}}) {
    ::mknod((root / "dev" / name).c_str(), S_IFCHR | 0666, makedev(195, minor));
  }
}

}  // namespace

TEST(LdCache, ParsesTheFixtureMadeByLdconfig) {
  auto entries = parse_ld_so_cache(fixture("ld.so.cache"));
  ASSERT_TRUE(entries) << entries.error().message;
  ASSERT_EQ(entries->size(), 6u);
  bool cuda = false;
  for (const auto& e : *entries) {
    EXPECT_TRUE(e.path.starts_with("/usr/lib/x86_64-linux-gnu/")) << e.path;
    if (e.name == "libcuda.so.1") cuda = e.path == "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
  }
  EXPECT_TRUE(cuda);
}

TEST(LdCache, ParsesThisHostsCache) {
  auto bytes = read_file("/etc/ld.so.cache");
  if (!bytes) GTEST_SKIP() << "this host has no /etc/ld.so.cache: " << bytes.error().message;
  auto entries = parse_ld_so_cache(*bytes);
  ASSERT_TRUE(entries) << entries.error().message;
  EXPECT_TRUE(std::any_of(entries->begin(), entries->end(),
                          [](const LdCacheEntry& e) { return e.name == "libc.so.6"; }));
}

TEST(LdCache, MalformedCachesAreErrorsNotCrashes) {
  std::string good = fixture("ld.so.cache");
  EXPECT_FALSE(parse_ld_so_cache(""));
  EXPECT_FALSE(parse_ld_so_cache("not a cache at all, just some text of some length ........"));
  EXPECT_FALSE(parse_ld_so_cache(good.substr(0, 30)));
  EXPECT_FALSE(parse_ld_so_cache(good.substr(0, 60))) << "entries past the end";
  std::string bad_offset = good;
  bad_offset[48 + 4] = '\xff';  // first entry's key offset
  bad_offset[48 + 5] = '\xff';
  EXPECT_FALSE(parse_ld_so_cache(bad_offset));
  std::string huge = good;
  huge[20] = '\xff';  // nlibs
  huge[21] = '\xff';
  EXPECT_FALSE(parse_ld_so_cache(huge));
}

TEST(CdiGenerate, GpuOperatorDriverRootMatchesTheGoldenSpec) {
  test::TempDir root;
  make_operator_tree(root);
  CdiGenerateOptions opt;
  opt.driver_root = "/run/nvidia/driver";
  auto r = generate_cdi_spec(HostFs(root.path()), two_gpus(), "550.54.15", opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->spec.cdi_version, "0.5.0") << "device names start with a digit";
  EXPECT_EQ(r->warnings, (std::vector<std::string>{"utility /usr/bin/nvidia-debugdump not found"}));
  // GPUFENCE_UPDATE_GOLDEN=1 rewrites the golden file; review its diff before committing.
  if (std::getenv("GPUFENCE_UPDATE_GOLDEN")) {
    ASSERT_TRUE(write_file_atomic(test::source_path("tests/fixtures/cdi/two-gpus-operator.yaml"),
                                  cdi_spec_to_yaml(r->spec)));
  }
  EXPECT_EQ(cdi_spec_to_yaml(r->spec), fixture("two-gpus-operator.yaml"));
  // And it reads back as the same spec.
  auto back = parse_cdi_spec(cdi_spec_to_yaml(r->spec), "golden");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(cdi_spec_to_json(*back), cdi_spec_to_json(r->spec));
  auto json_back = parse_cdi_spec(cdi_spec_to_json(r->spec).dump(), "json");
  ASSERT_TRUE(json_back);
  EXPECT_EQ(cdi_spec_to_json(*json_back), cdi_spec_to_json(r->spec));
}

TEST(CdiGenerate, FallsBackToLibraryDirectoriesAndWarnsAboutMissingLibraries) {
  test::TempDir root;
  root.write("usr/lib/x86_64-linux-gnu/libcuda.so.1", "elf");
  root.write("usr/lib/x86_64-linux-gnu/libnvidia-container.so.1", "toolkit, not driver");
  auto r = generate_cdi_spec(HostFs(root.path()), two_gpus(), "550.54.15", {});
  ASSERT_TRUE(r) << r.error().message;
  auto has = [&](const std::string& w) {
    return std::find(r->warnings.begin(), r->warnings.end(), w) != r->warnings.end();
  };
  EXPECT_TRUE(has("driver library libnvidia-ml.so* not found"));
  EXPECT_TRUE(has("driver library libnvcuvid.so* not found"));
  EXPECT_TRUE(has("driver library libnvidia-encode.so* not found"));
  EXPECT_FALSE(has("driver library libcuda.so* not found"));
  for (const auto& m : r->spec.edits.mounts)
    EXPECT_EQ(m.container_path.find("libnvidia-container"), std::string::npos);
}

TEST(CdiGenerate, NoDriverIsAnError) {
  test::TempDir root;
  auto r = generate_cdi_spec(HostFs(root.path()), two_gpus(), "550.54.15", {});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("no NVIDIA driver libraries found"), std::string::npos);
  EXPECT_FALSE(generate_cdi_spec(HostFs(root.path()), {}, "550.54.15", {}));
}

TEST(CdiSpecValidation, RulesAreEnforcedAndNamed) {
  auto error_of = [](const std::string& yaml) {
    auto s = parse_cdi_spec(yaml, "t.yaml");
    return s ? std::string("(valid)") : s.error().message;
  };
  const std::string ok =
      "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    "
      "deviceNodes:\n    - path: /dev/nvidia0\n";
  EXPECT_EQ(error_of(ok), "(valid)");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = ok;
    s.replace(s.find(from), from.size(), to);
    return error_of(s);
  };
  EXPECT_NE(with("0.5.0", "0.4.0").find("too old for what the spec uses (needs 0.5.0)"),
            std::string::npos);
  EXPECT_NE(with("0.5.0", "2.0.0").find("is not a CDI version"), std::string::npos);
  EXPECT_NE(with("nvidia.com/gpu", "nvidia.com").find("is not vendor/class"), std::string::npos);
  EXPECT_NE(with("nvidia.com/gpu", "-x/gpu").find("is not vendor/class"), std::string::npos);
  EXPECT_NE(with("name: \"0\"", "name: \"bad name\"").find("device name 'bad name' is invalid"),
            std::string::npos);
  EXPECT_NE(with("/dev/nvidia0", "dev/nvidia0").find("must be absolute"), std::string::npos);
  EXPECT_NE(with("    deviceNodes:\n    - path: /dev/nvidia0\n", "    env: [\"NOEQUALS\"]\n")
                .find("is not KEY=VALUE"),
            std::string::npos);
  EXPECT_NE(with("  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n", "")
                .find("has no containerEdits"),
            std::string::npos);
  EXPECT_NE(with("    - path: /dev/nvidia0\n", "    - path: /dev/nvidia0\n      permissions: rwx\n")
                .find("may hold only r, w, m"),
            std::string::npos);
  EXPECT_NE(
      error_of(ok + "- name: \"0\"\n  containerEdits:\n    env: [A=1]\n").find("defined twice"),
      std::string::npos);
  EXPECT_NE(
      error_of(ok + "containerEdits:\n  hooks:\n  - hookName: whenever\n    path: /bin/true\n")
          .find("unknown hookName 'whenever'"),
      std::string::npos);
  EXPECT_NE(error_of(ok + "containerEdits:\n  intelRdt: {closID: x}\n")
                .find("field 'intelRdt' is unknown or not supported"),
            std::string::npos);
  EXPECT_NE(error_of("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n").find("spec has no devices"),
            std::string::npos);
  EXPECT_NE(
      error_of("kind: nvidia.com/gpu\ndevices: []\n").find("missing required field 'cdiVersion'"),
      std::string::npos);
  auto syntax = error_of("cdiVersion: 0.5.0\nkind: [unclosed\n");
  EXPECT_NE(syntax.find("t.yaml:"), std::string::npos) << syntax;
  EXPECT_NE(error_of("- just\n- a list\n").find("expected a map"), std::string::npos);
}

TEST(CdiSpecValidation, MinimumVersions) {
  CdiSpec s;
  s.kind = "nvidia.com/gpu";
  CdiContainerEdits e;
  e.device_nodes.push_back({"/dev/nvidia0", "", "", {}, {}, {}, "", {}, {}});
  s.devices.push_back({"gpu0", {}, e});
  EXPECT_EQ(minimum_cdi_version(s), "0.3.0");
  s.edits.mounts.push_back({"/a", "/a", {}, "bind"});
  EXPECT_EQ(minimum_cdi_version(s), "0.4.0");
  s.devices[0].edits.device_nodes[0].host_path = "/host/dev/nvidia0";
  EXPECT_EQ(minimum_cdi_version(s), "0.5.0");
  s.annotations["a"] = "b";
  EXPECT_EQ(minimum_cdi_version(s), "0.6.0");
}
