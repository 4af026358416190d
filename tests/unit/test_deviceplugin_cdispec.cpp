// The device plugin's own CDI spec (deviceplugin/cdi_spec.hpp): what it holds on fake host roots
// (device nodes only, or with driver files; host paths under --host-root; hostPaths under
// --dev-root), how it is written (atomically, rewritten only when different, regenerated for a
// new GPU set), and that gpufence-runtime applying it after containerd already did adds nothing
// twice, also when a user's `gpufence cdi generate` spec defines the same devices in /etc/cdi.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "cdi/generate.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "deviceplugin/cdi_spec.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/cdi_edits.hpp"
#include "runtime/isolation.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

std::vector<Gpu> gpus(unsigned count) {
  std::vector<Gpu> out;
  for (unsigned i = 0; i < count; ++i) {
    Gpu g;
    g.index = i;
    g.minor = i;
    g.uuid = test::mock_uuid(i);
    g.driver_version = "550.54.15";
    out.push_back(g);
  }
  return out;
}

// /dev/nvidia0, /dev/nvidia1 and /dev/nvidiactl under `root`; false when mknod is not allowed.
bool make_nodes(const test::TempDir& root) {
  std::filesystem::create_directories(root / "dev");
  for (auto [name, minor] : {std::pair{"nvidia0", 0}, {"nvidia1", 1}, {"nvidiactl", 255}}) {
    if (::mknod((root / "dev" / name).c_str(), S_IFCHR | 0666, makedev(195, minor)) != 0)
      return false;
  }
  return true;
}

// The driver's libraries as the fixture ld.so.cache names them, at the host's standard paths.
void make_driver_files(const test::TempDir& root) {
  root.write("etc/ld.so.cache",
             read_file(test::source_path("tests/fixtures/cdi/ld.so.cache")).value());
  for (std::string lib : {"libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-encode",
                          "libnvidia-ptxjitcompiler", "libnvidia-nvvm"}) {
    std::string so = lib == "libnvidia-nvvm" ? ".so.4" : ".so.1";
    root.write("usr/lib/x86_64-linux-gnu/" + lib + ".so.550.54.15", "elf");
    std::filesystem::create_symlink(lib + ".so.550.54.15",
                                    root / ("usr/lib/x86_64-linux-gnu/" + lib + so));
  }
}

const CdiDevice* device(const CdiSpec& spec, const std::string& name) {
  for (const auto& d : spec.devices)
    if (d.name == name) return &d;
  return nullptr;
}

std::vector<const CdiDeviceNode*> all_nodes(const CdiSpec& spec) {
  std::vector<const CdiDeviceNode*> out;
  for (const auto& n : spec.edits.device_nodes) out.push_back(&n);
  for (const auto& d : spec.devices)
    for (const auto& n : d.edits.device_nodes) out.push_back(&n);
  return out;
}

size_t count_if_key(const Json& list, const std::string& key, const std::string& value) {
  if (!list.is_array()) return 0;
  return static_cast<size_t>(std::count_if(list.begin(), list.end(), [&](const Json& e) {
    return e.is_object() && e.value(key, "") == value;
  }));
}

}  // namespace

TEST(PluginCdiSpec, WithoutDriverFilesHoldsTheDeviceNodesAndNoHook) {
  test::TempDir root;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  auto r = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), {});
  ASSERT_TRUE(r) << r.error().message;
  const CdiSpec& spec = r->spec;
  EXPECT_EQ(spec.kind, kCdiKind);
  for (unsigned i = 0; i < 2; ++i) {
    const std::string node = "/dev/nvidia" + std::to_string(i);
    for (const std::string& name : {test::mock_uuid(i), std::to_string(i)}) {
      const CdiDevice* d = device(spec, name);
      ASSERT_NE(d, nullptr) << name;
      ASSERT_EQ(d->edits.device_nodes.size(), 1u);
      EXPECT_EQ(d->edits.device_nodes[0].path, node);
      EXPECT_EQ(d->edits.device_nodes[0].host_path, "") << "dev root / needs no hostPath";
    }
  }
  ASSERT_NE(device(spec, "all"), nullptr);
  EXPECT_EQ(device(spec, "all")->edits.device_nodes.size(), 2u);
  ASSERT_EQ(spec.edits.device_nodes.size(), 1u);
  EXPECT_EQ(spec.edits.device_nodes[0].path, "/dev/nvidiactl");
  EXPECT_TRUE(spec.edits.hooks.empty()) << "no libraries: nothing for ldconfig to find";
  EXPECT_TRUE(spec.edits.mounts.empty());
  EXPECT_TRUE(std::any_of(r->warnings.begin(), r->warnings.end(), [](const std::string& w) {
    return w.find("device nodes only") != std::string::npos;
  }));
  EXPECT_TRUE(validate_cdi_spec(spec));
}

TEST(PluginCdiSpec, UnderHostRootNamesHostPathsAndItsHookCarriesEnvAndTimeout) {
  test::TempDir root;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  make_driver_files(root);
  PluginCdiSpecOptions opt;
  opt.hook_path = "/opt/gpufence/bin/gpufence-runtime";
  auto r = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), opt);
  ASSERT_TRUE(r) << r.error().message;
  const CdiSpec& spec = r->spec;
  ASSERT_FALSE(spec.edits.mounts.empty());
  for (const auto& m : spec.edits.mounts) {
    EXPECT_TRUE(m.host_path.starts_with("/usr/lib/x86_64-linux-gnu/")) << m.host_path;
    EXPECT_EQ(m.host_path.find(root.path().string()), std::string::npos)
        << "--host-root leaked into " << m.host_path;
  }
  ASSERT_EQ(spec.edits.hooks.size(), 1u);
  const CdiHook& hook = spec.edits.hooks[0];
  EXPECT_EQ(hook.path, "/opt/gpufence/bin/gpufence-runtime");
  EXPECT_EQ(hook.hook_name, "createContainer");
  EXPECT_FALSE(hook.env.empty()) << "a hook without env runs with the container's environment";
  EXPECT_TRUE(hook.timeout.has_value());
}

TEST(PluginCdiSpec, DevRootPrefixesEveryDeviceNodeHostPath) {
  test::TempDir root;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  PluginCdiSpecOptions opt;
  opt.dev_root = "/run/nvidia/driver/";
  auto r = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), opt);
  ASSERT_TRUE(r) << r.error().message;
  auto nodes = all_nodes(r->spec);
  ASSERT_EQ(nodes.size(), 7u);  // nvidiactl; 0, 1 by index and by UUID; "all" with both
  for (const auto* n : nodes) {
    EXPECT_TRUE(n->path.starts_with("/dev/nvidia")) << n->path;
    EXPECT_EQ(n->host_path, "/run/nvidia/driver" + n->path);
  }
  EXPECT_EQ(r->spec.edits.device_nodes.at(0).host_path, "/run/nvidia/driver/dev/nvidiactl");
  EXPECT_NE(r->spec.cdi_version, "0.3.0") << "hostPath needs cdiVersion 0.5.0";
  EXPECT_TRUE(validate_cdi_spec(r->spec));
}

TEST(PluginCdiSpec, WritesAtomicallyAndOnlyWhenDifferent) {
  test::TempDir root, dirs;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  auto r = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), {});
  ASSERT_TRUE(r) << r.error().message;
  PluginCdiSpecOptions opt;
  opt.dir = (dirs / "var/run/cdi").string();  // missing: created
  auto w = write_plugin_cdi_spec(r->spec, opt);
  ASSERT_TRUE(w) << w.error().message;
  EXPECT_EQ(*w, SpecWrite::written);
  const auto path = plugin_cdi_spec_path(opt);
  EXPECT_EQ(path.filename(), "gpufence.io-gpu.json");
  auto text = read_file(path);
  ASSERT_TRUE(text);
  auto back = parse_cdi_spec(*text, path.string());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->devices.size(), r->spec.devices.size());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  const ino_t first = st.st_ino;

  EXPECT_EQ(write_plugin_cdi_spec(r->spec, opt).value(), SpecWrite::unchanged);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, first) << "an unchanged spec must not be rewritten";

  // Edited by someone: replaced by rename (a new inode), never rewritten in place, where a
  // runtime reading it meanwhile could see half a file.
  ASSERT_TRUE(write_file_atomic(path, "{\"kind\": \"nvidia.com/gpu\"}", Durability::none));
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const ino_t edited = st.st_ino;
  EXPECT_EQ(write_plugin_cdi_spec(r->spec, opt).value(), SpecWrite::written);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_NE(st.st_ino, edited);
  EXPECT_EQ(read_file(path).value(), *text);

  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(opt.dir)) {
    ++files;
    EXPECT_EQ(e.path(), path) << "left behind: " << e.path();
  }
  EXPECT_EQ(files, 1u);
}

TEST(PluginCdiSpec, ANewGpuSetReplacesTheOldSpec) {
  test::TempDir root, dirs;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  PluginCdiSpecOptions opt;
  opt.dir = dirs.path().string();
  auto two = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), opt);
  ASSERT_TRUE(two);
  ASSERT_TRUE(write_plugin_cdi_spec(two->spec, opt));
  auto one = build_plugin_cdi_spec(HostFs(root.path()), gpus(1), opt);
  ASSERT_TRUE(one);
  EXPECT_EQ(write_plugin_cdi_spec(one->spec, opt).value(), SpecWrite::written);
  auto back = parse_cdi_spec(read_file(plugin_cdi_spec_path(opt)).value(), "spec");
  ASSERT_TRUE(back);
  EXPECT_NE(device(*back, test::mock_uuid(0)), nullptr);
  EXPECT_EQ(device(*back, test::mock_uuid(1)), nullptr) << "a GPU gone must leave the spec";
}

TEST(PluginCdiSpec, RefusesFileNamesTheRuntimesWouldNotRead) {
  CdiSpec spec;
  PluginCdiSpecOptions opt;
  test::TempDir dirs;
  opt.dir = dirs.path().string();
  for (const std::string bad : {"spec.txt", "../etc/cdi/x.json", "a/b.yaml"}) {
    opt.file_name = bad;
    auto w = write_plugin_cdi_spec(spec, opt);
    ASSERT_FALSE(w) << bad;
    EXPECT_NE(w.error().message.find(bad), std::string::npos) << w.error().message;
  }
  opt.file_name = kPluginCdiSpecFile;
  opt.dir = "";
  EXPECT_FALSE(write_plugin_cdi_spec(spec, opt));
}

// containerd 1.7+/2.x with CDI on injects the spec into config.json, then gpufence-runtime reads
// the same cdi.k8s.io annotation and applies it again: nothing may end up twice.
TEST(PluginCdiSpec, AppliedTwiceAddsNothingTwice) {
  test::TempDir root, dirs;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  make_driver_files(root);
  PluginCdiSpecOptions opt;
  opt.dir = (dirs / "var/run/cdi").string();
  auto r = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), opt);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_TRUE(write_plugin_cdi_spec(r->spec, opt));
  auto specs = load_cdi_specs({(dirs / "etc/cdi").string(), opt.dir}, {kCdiKind});
  ASSERT_TRUE(specs) << specs.error().message;
  HostFs host(root.path());
  const std::vector<std::string> names = {gpu_cdi_name(test::mock_uuid(1))};

  Json oci = Json::parse(R"({"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]},
                             "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}})");
  auto first = apply_cdi_devices(oci, *specs, names, host);
  ASSERT_TRUE(first) << first.error().message;
  IsolationPlan plan;
  plan.grant = first->nodes;
  ASSERT_TRUE(isolate_spec(oci, plan));
  const Json once = oci;  // as containerd's injection leaves it, device nodes included

  auto second = apply_cdi_devices(oci, *specs, names, host);
  ASSERT_TRUE(second) << second.error().message;
  plan.grant = second->nodes;
  ASSERT_TRUE(isolate_spec(oci, plan));

  EXPECT_EQ(oci["mounts"].size(), once["mounts"].size());
  EXPECT_EQ(oci["hooks"]["createContainer"].size(), 1u);
  EXPECT_EQ(oci["process"]["env"], once["process"]["env"]);
  EXPECT_EQ(count_if_key(oci["linux"]["devices"], "path", "/dev/nvidia1"), 1u);
  EXPECT_EQ(count_if_key(oci["linux"]["devices"], "path", "/dev/nvidiactl"), 1u);
  EXPECT_EQ(count_if_key(oci["linux"]["devices"], "path", "/dev/nvidia0"), 0u);
  EXPECT_EQ(oci["linux"]["resources"]["devices"].size(),
            once["linux"]["resources"]["devices"].size());
  EXPECT_EQ(oci, once);
}

// NVIDIA's toolkit (`nvidia-ctk cdi generate`, its refresh unit) writes kind nvidia.com/gpu with
// names 0, 1, the UUIDs and "all" into /var/run/cdi, the directory the plugin writes to. The
// plugin's own kind keeps both resolvable: upstream keys devices by kind and name, so nothing
// conflicts, and each name resolves to its own kind's file. The plugin's spec of the old kind
// beside NVIDIA's is the conflict this avoids (every shared name dropped).
TEST(PluginCdiSpec, CoexistsWithNvidiasSpecInOneDirectory) {
  test::TempDir root, dirs;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  make_driver_files(root);
  HostFs host(root.path());
  CdiGenerateOptions nvidia_opt;  // the shape nvidia-ctk writes: kind nvidia.com/gpu
  nvidia_opt.hook_path = "/usr/bin/nvidia-cdi-hook";
  auto nvidia = generate_cdi_spec(host, gpus(2), "550.54.15", nvidia_opt);
  ASSERT_TRUE(nvidia) << nvidia.error().message;
  ASSERT_EQ(nvidia->spec.kind, kNvidiaCdiKind);
  PluginCdiSpecOptions opt;
  opt.dir = (dirs / "var/run/cdi").string();
  dirs.write("var/run/cdi/nvidia.yaml", cdi_spec_to_yaml(nvidia->spec));
  auto plugin = build_plugin_cdi_spec(host, gpus(2), opt);
  ASSERT_TRUE(plugin);
  ASSERT_TRUE(write_plugin_cdi_spec(plugin->spec, opt));

  auto files = read_cdi_spec_files(HostFs("/"), {opt.dir});
  EXPECT_TRUE(duplicate_cdi_devices(summarize_cdi_spec_files(files)).empty());
  auto specs = load_cdi_specs({opt.dir}, {kCdiKind, kNvidiaCdiKind});
  ASSERT_TRUE(specs) << specs.error().message;
  for (const auto& [name, file, hook] :
       {std::tuple{gpu_cdi_name(test::mock_uuid(0)), plugin_cdi_spec_path(opt).string(),
                   opt.hook_path},
        std::tuple{cat(kNvidiaCdiKind, "=", test::mock_uuid(0)), opt.dir + "/nvidia.yaml",
                   nvidia_opt.hook_path}}) {
    Json oci = Json::parse(R"({"ociVersion": "1.0.2", "process": {"env": []}})");
    auto applied = apply_cdi_devices(oci, *specs, {name}, host);
    ASSERT_TRUE(applied) << applied.error().message;
    ASSERT_EQ(applied->from.size(), 1u);
    EXPECT_EQ(applied->from[0], cat(name, " (", file, ")"));
    ASSERT_EQ(oci["hooks"]["createContainer"].size(), 1u) << "only its own spec's edits";
    EXPECT_EQ(oci["hooks"]["createContainer"][0]["path"], hook);
  }

  // The old plugin's file (kind nvidia.com/gpu) in the same directory: every shared name is a
  // conflict, refused with both files named, and the plugin removes that file.
  CdiSpec legacy = plugin->spec;
  legacy.kind = std::string(kNvidiaCdiKind);
  dirs.write(std::string("var/run/cdi/") + kLegacyPluginCdiSpecFile, cdi_spec_to_yaml(legacy));
  auto same_dir = load_cdi_specs({opt.dir}, {kNvidiaCdiKind});
  ASSERT_TRUE(same_dir) << same_dir.error().message;
  Json oci2 = Json::parse(R"({"ociVersion": "1.0.2", "process": {"env": []}})");
  auto conflict =
      apply_cdi_devices(oci2, *same_dir, {cat(kNvidiaCdiKind, "=", test::mock_uuid(0))}, host);
  ASSERT_FALSE(conflict);
  EXPECT_NE(conflict.error().message.find("nvidia.yaml"), std::string::npos);
  EXPECT_NE(conflict.error().message.find(kLegacyPluginCdiSpecFile), std::string::npos);
  auto removed = remove_legacy_plugin_cdi_spec(opt);
  ASSERT_TRUE(removed) << removed.error().message;
  EXPECT_TRUE(*removed);
  EXPECT_FALSE(std::filesystem::exists(dirs / "var/run/cdi" / kLegacyPluginCdiSpecFile));
  EXPECT_FALSE(*remove_legacy_plugin_cdi_spec(opt)) << "gone: nothing to remove";
}

// A link a pod planted at the old file's name: the name goes, what it points to stays.
TEST(PluginCdiSpec, RemovingTheOldSpecRemovesALinkNotItsTarget) {
  test::TempDir dirs;
  dirs.write("target", "keep");
  std::filesystem::create_directories(dirs / "cdi");
  std::filesystem::create_symlink(dirs / "target", dirs / "cdi" / kLegacyPluginCdiSpecFile);
  PluginCdiSpecOptions opt;
  opt.dir = (dirs / "cdi").string();
  auto removed = remove_legacy_plugin_cdi_spec(opt);
  ASSERT_TRUE(removed) << removed.error().message;
  EXPECT_TRUE(*removed);
  EXPECT_FALSE(std::filesystem::is_symlink(dirs / "cdi" / kLegacyPluginCdiSpecFile));
  EXPECT_EQ(*read_file(dirs / "target"), "keep");
}

// A driver container's files (GPU Operator): read under --host-root at the driver root, named
// by their host paths under it.
TEST(PluginCdiSpec, DriverRootNamesTheDriverFilesHostPathsUnderIt) {
  test::TempDir root, driver;
  if (!make_nodes(root)) GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  make_driver_files(driver);
  std::filesystem::create_directories(root / "run/nvidia");
  std::filesystem::create_symlink(driver.path(), root / "run/nvidia/driver");
  PluginCdiSpecOptions opt;
  opt.driver_root = "/run/nvidia/driver";
  auto r = build_plugin_cdi_spec(HostFs(root.path()), gpus(2), opt);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_FALSE(r->spec.edits.mounts.empty());
  for (const auto& m : r->spec.edits.mounts) {
    EXPECT_TRUE(m.host_path.starts_with("/run/nvidia/driver/usr/lib/")) << m.host_path;
    EXPECT_TRUE(m.container_path.starts_with("/usr/lib/")) << m.container_path;
  }
  EXPECT_EQ(r->spec.edits.hooks.size(), 1u);
}
