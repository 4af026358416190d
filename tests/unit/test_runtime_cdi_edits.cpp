// The runtime's CDI reader: kind first, other vendors' specs never judged, nvidia.com/gpu specs
// strict, upstream's directory priority, and what applying edits adds to config.json.
#include <gtest/gtest.h>

#include <fstream>

#include "cdi/hook_defaults.hpp"
#include "cdi/spec_dirs.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "runtime/cdi_edits.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

// An nvidia.com/gpu spec whose devices carry fixed major/minor (no device nodes needed) and an
// env marker saying which file they came from.
std::string nvidia_spec(const std::string& marker, const std::string& extra = "",
                        const std::string& names = "\"0\"") {
  std::string out = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n";
  for (auto name : split(names, ',')) {
    out += cat("- name: ", name, "\n  containerEdits:\n    env: [FROM=", marker,
               "]\n    deviceNodes:\n    - {path: /dev/nvidia0, major: 195, minor: 0}\n");
  }
  return out + extra;
}

// A valid CDI spec of another vendor using fields gpufence does not model for GPUs.
const std::string kForeignWithGids =
    "cdiVersion: 0.7.0\nkind: vendor.example/fpga\ncontainerEdits:\n  additionalGids: [44]\n"
    "devices:\n- name: fpga0\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/fpga0}\n";

Json minimal_oci() {
  return Json::parse(R"({"ociVersion":"1.0.2","process":{"env":["PATH=/bin","LD_PRELOAD=./x.so"],
    "user":{"uid":0,"gid":0}},"root":{"path":"rootfs"}})");
}

std::string read_text(const std::filesystem::path& p) {
  return read_file(p.string()).value();
}

}  // namespace

TEST(RuntimeCdiReader, AForeignValidSpecWithAdditionalGidsNeverBlocksGpuSpecs) {
  test::TempDir dir;
  dir.write("cdi/intel-fpga.yaml", kForeignWithGids);
  dir.write("cdi/nvidia.yaml", nvidia_spec("nvidia"));
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  ASSERT_EQ(specs->size(), 1u);
  EXPECT_EQ((*specs)[0].path, (dir / "cdi/nvidia.yaml").string());
  Json oci = minimal_oci();
  auto applied = apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/"));
  ASSERT_TRUE(applied) << applied.error().message;
  EXPECT_FALSE(oci["process"]["user"].contains("additionalGids")) << "foreign edits not applied";
}

TEST(RuntimeCdiReader, MalformedForeignSpecsAreSkippedAndLogged) {
  test::TempDir dir;
  dir.write("cdi/a-broken-types.yaml",
            "cdiVersion: 0.5.0\nkind: vendor.example/x\ndevices: {name: 5}\nwhatever: [1]\n");
  dir.write("cdi/b-syntax.yaml", "cdiVersion: 0.5.0\nkind: [unclosed\n");
  dir.write("cdi/c-no-kind.json", "{\"cdiVersion\": \"0.5.0\"}");
  dir.write("cdi/d-not-json.json", "{\"kind\": \"nvidia.com/gpu\",, }");
  dir.write("cdi/nvidia.yaml", nvidia_spec("nvidia"));
  dir.write("cdi/notes.txt", "not a spec at all");
  Logger log(LogLevel::debug);
  ASSERT_TRUE(log.open_file((dir / "log").string()));
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"}, log);
  ASSERT_TRUE(specs) << specs.error().message;
  ASSERT_EQ(specs->size(), 1u);
  std::string lines = read_text(dir / "log");
  EXPECT_NE(lines.find("runtime.cdi_spec_other_kind"), std::string::npos) << lines;
  EXPECT_NE(lines.find("a-broken-types.yaml"), std::string::npos) << lines;
  for (const char* f : {"b-syntax.yaml", "c-no-kind.json", "d-not-json.json"}) {
    EXPECT_NE(lines.find(cat("runtime.cdi_spec_skipped file=", (dir / "cdi" / f).string())),
              std::string::npos)
        << f << "\n"
        << lines;
  }
  EXPECT_EQ(lines.find("notes.txt"), std::string::npos) << "only *.json and *.yaml are specs";
}

TEST(RuntimeCdiReader, AMalformedNvidiaSpecIsAnErrorNamingTheFileAndTheField) {
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml", nvidia_spec("nvidia"));
  dir.write("cdi/other.json",
            R"({"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"1",
                "containerEdits":{"mounts":[{"hostPath":5,"containerPath":"/x"}]}}]})");
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_FALSE(specs);
  const std::string& e = specs.error().message;
  EXPECT_NE(e.find("malformed CDI spec: " + (dir / "cdi/other.json").string()), std::string::npos)
      << e;
  EXPECT_NE(e.find("devices[0].containerEdits.mounts[0].hostPath must be a string"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
}

TEST(RuntimeCdiReader, TwoNvidiaSpecsInOneDirectoryConflictOnlyForTheSharedDevice) {
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml", nvidia_spec("a", "", "\"0\",\"1\""));
  dir.write("cdi/operator.json", nvidia_spec("b", "", "\"1\",\"2\""));
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  auto shared = apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=1"}, HostFs("/"));
  ASSERT_FALSE(shared);
  EXPECT_EQ(shared.error().message,
            cat("CDI device nvidia.com/gpu=1 is defined by both ",
                (dir / "cdi/nvidia.yaml").string(), " and ", (dir / "cdi/operator.json").string(),
                " (one directory holds both: remove one)"));
  // Devices only one file defines still resolve (upstream drops only the conflicting name).
  Json ok = minimal_oci();
  auto single =
      apply_cdi_devices(ok, *specs, {"nvidia.com/gpu=0", "nvidia.com/gpu=2"}, HostFs("/"));
  ASSERT_TRUE(single) << single.error().message;
}

// pkg/cdi cache.go resolveConflict: a later spec directory has priority over an earlier one.
TEST(RuntimeCdiReader, ALaterDirectoryOverridesAnEarlierOneAsUpstreamDoes) {
  test::TempDir dir;
  dir.write("etc-cdi/nvidia.yaml", nvidia_spec("etc", "", "\"0\",\"1\""));
  dir.write("run-cdi/operator.yaml", nvidia_spec("run", "", "\"0\""));
  Logger log(LogLevel::debug);
  ASSERT_TRUE(log.open_file((dir / "log").string()));
  auto specs = load_cdi_specs({(dir / "etc-cdi").string(), (dir / "run-cdi").string()},
                              {"nvidia.com/gpu"}, log);
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  auto applied = apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/"));
  ASSERT_TRUE(applied) << applied.error().message;
  EXPECT_EQ(get_env(oci, "FROM"), "run");
  ASSERT_EQ(applied->from.size(), 1u);
  EXPECT_NE(applied->from[0].find("run-cdi/operator.yaml"), std::string::npos);
  // Device 1 is only in /etc/cdi's file: still served from there.
  Json other = minimal_oci();
  ASSERT_TRUE(apply_cdi_devices(other, *specs, {"nvidia.com/gpu=1"}, HostFs("/")));
  EXPECT_EQ(get_env(other, "FROM"), "etc");
  std::string lines = read_text(dir / "log");
  EXPECT_NE(lines.find("runtime.cdi_device_overridden device=\"nvidia.com/gpu=0\""),
            std::string::npos)
      << lines;
}

TEST(CdiSpecDirs, DuplicateDevicesForTheDoctor) {
  auto file = [](const std::string& path, size_t priority, std::vector<std::string> names) {
    CdiSpecFile f;
    f.path = path;
    f.priority = priority;
    f.spec.kind = "nvidia.com/gpu";
    for (auto& n : names) f.spec.devices.push_back({n, {}, {}});
    return f;
  };
  auto summaries = [](const std::vector<CdiSpecFile>& files) {
    std::vector<CdiFileSummary> out;
    for (const auto& f : files) {
      CdiFileSummary sum{f.path, f.priority, f.spec.kind, {}, ""};
      for (const auto& d : f.spec.devices) sum.devices.push_back(d.name);
      out.push_back(sum);
    }
    return out;
  };
  std::vector<CdiSpecFile> specs = {
      file("/etc/cdi/a.yaml", 0, {"0", "1", "all"}), file("/etc/cdi/b.yaml", 0, {"1"}),
      file("/var/run/cdi/op.yaml", 1, {"0", "all"}), file("/var/run/cdi/op2.yaml", 1, {"all"})};
  auto dups = duplicate_cdi_devices(summaries(specs));
  ASSERT_EQ(dups.size(), 3u);
  using R = CdiDuplicateDevice::Resolution;
  EXPECT_EQ(dups[0].name, "nvidia.com/gpu=0");
  EXPECT_EQ(dups[0].resolution, R::overridden);
  EXPECT_EQ(dups[0].winners, (std::vector<std::string>{"/var/run/cdi/op.yaml"}));
  EXPECT_EQ(dups[0].ignored, (std::vector<std::string>{"/etc/cdi/a.yaml"}));
  EXPECT_EQ(dups[1].name, "nvidia.com/gpu=1");
  EXPECT_EQ(dups[1].resolution, R::conflict);
  EXPECT_EQ(dups[1].winners, (std::vector<std::string>{"/etc/cdi/a.yaml", "/etc/cdi/b.yaml"}));
  EXPECT_EQ(dups[2].name, "nvidia.com/gpu=all");
  EXPECT_EQ(dups[2].resolution, R::conflict);
  EXPECT_EQ(dups[2].winners,
            (std::vector<std::string>{"/var/run/cdi/op.yaml", "/var/run/cdi/op2.yaml"}));
  EXPECT_EQ(dups[2].ignored, (std::vector<std::string>{"/etc/cdi/a.yaml"}));
  // Priority removes the overridden copies, keeps the conflicts.
  auto removed = apply_cdi_priority(specs);
  EXPECT_EQ(removed.size(), 2u);
  ASSERT_EQ(specs[0].spec.devices.size(), 1u);
  EXPECT_EQ(specs[0].spec.devices[0].name, "1");
  EXPECT_EQ(specs[1].spec.devices.size(), 1u);
  EXPECT_EQ(specs[2].spec.devices.size(), 2u);
}

TEST(CdiSpecDirs, ReadsOnlyJsonAndYamlDirectlyInEachDirectorySorted) {
  test::TempDir root;
  root.write("etc/cdi/b.yaml", "x");
  root.write("etc/cdi/a.json", "y");
  root.write("etc/cdi/c.yml", "z");
  root.write("etc/cdi/sub/d.yaml", "w");
  auto files = read_cdi_spec_files(HostFs(root.path()), {"/etc/cdi/", "/var/run/cdi"});
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].path, "/etc/cdi/a.json");
  EXPECT_EQ(files[1].path, "/etc/cdi/b.yaml");
  EXPECT_EQ(*files[1].text, "x");
}

TEST(RuntimeCdiEdits, HooksWithoutEnvGetAMinimalEnvAndATimeout) {
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml",
            nvidia_spec("n",
                        "containerEdits:\n  hooks:\n  - {hookName: createContainer, path: "
                        "/usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache]}\n"
                        "  - {hookName: poststop, path: /bin/true, env: [A=1], timeout: 7}\n"));
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  ASSERT_TRUE(apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/")));
  const Json& hook = oci["hooks"]["createContainer"][0];
  EXPECT_EQ(hook["path"], "/usr/bin/nvidia-cdi-hook");
  // Not the container's LD_PRELOAD: only the minimal env.
  EXPECT_EQ(hook["env"], Json(kMinimalHookEnv));
  EXPECT_EQ(hook["timeout"], kDefaultHookTimeoutSeconds);
  const Json& own = oci["hooks"]["poststop"][0];
  EXPECT_EQ(own["env"], Json::array({"A=1"}));
  EXPECT_EQ(own["timeout"], 7);
}

TEST(RuntimeCdiEdits, PermissionsNoneIsNeverGrantedAndOthersAreReported) {
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml",
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n"
            "    deviceNodes:\n    - {path: /dev/nvidia0, major: 195, minor: 0}\n"
            "    - {path: /dev/nvidia-caps/x, major: 237, minor: 1, permissions: none}\n"
            "    - {path: /dev/nvidia-uvm, major: 511, minor: 0, permissions: r}\n");
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  auto applied = apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/"));
  ASSERT_TRUE(applied) << applied.error().message;
  ASSERT_EQ(applied->nodes.size(), 2u);
  EXPECT_EQ(applied->nodes[0].path, "/dev/nvidia0");
  EXPECT_EQ(applied->nodes[1].path, "/dev/nvidia-uvm");
  EXPECT_EQ(applied->access.at("/dev/nvidia0"), "rwm");
  EXPECT_EQ(applied->access.at("/dev/nvidia-uvm"), "r");
  EXPECT_EQ(applied->access.at("/dev/nvidia-caps/x"), "");
}

TEST(RuntimeCdiEdits, AdditionalGidsAreAddedOnceAndZeroSkipped) {
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml",
            "cdiVersion: 0.7.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  additionalGids: [44, 0]\n"
            "devices:\n- name: \"0\"\n  containerEdits:\n    additionalGids: [44, 107]\n");
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  ASSERT_TRUE(apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/")));
  EXPECT_EQ(oci["process"]["user"]["additionalGids"], Json::array({44, 107}));
}

TEST(RuntimeCdiEdits, IntelRdtAndNetDevicesInAGpuSpecRefuseTheCreate) {
  test::TempDir dir;
  dir.write(
      "cdi/nvidia.yaml",
      nvidia_spec("n", "- name: rdt\n  containerEdits:\n    intelRdt: {closID: gold}\n") + "");
  std::string text = read_text(dir / "cdi/nvidia.yaml");
  text.replace(text.find("0.5.0"), 5, "1.1.0");
  dir.write("cdi/nvidia.yaml", text);
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  Json before = oci;
  auto r = apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=rdt"}, HostFs("/"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::unsupported);
  EXPECT_NE(r.error().message.find("intelRdt is not applied by gpufence"), std::string::npos);
  // A device of the same spec without it still applies.
  EXPECT_TRUE(apply_cdi_devices(before, *specs, {"nvidia.com/gpu=0"}, HostFs("/")));
}

TEST(RuntimeCdiEdits, UnknownDeviceNamesTheSpecsSearched) {
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml", nvidia_spec("n"));
  auto specs =
      load_cdi_specs({(dir / "cdi").string(), (dir / "missing").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  auto r = apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=7"}, HostFs("/"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, cat("unknown CDI device nvidia.com/gpu=7 (not in ",
                                   (dir / "cdi/nvidia.yaml").string(), ")"));
}

TEST(RuntimeCdiEdits, ASpecContainerdAlreadyInjectedIsNotAppliedTwice) {
  // containerd 1.7+ with enable_cdi resolves the cdi.k8s.io annotations itself: the spec then
  // already carries the CDI spec's hook and mounts when gpufence-runtime applies it.
  test::TempDir dir;
  dir.write("cdi/nvidia.yaml",
            nvidia_spec("n",
                        "containerEdits:\n  hooks:\n  - {hookName: createContainer, path: "
                        "/usr/bin/gpufence-runtime, args: [gpufence-runtime, hook, update-ldcache, "
                        "--folder, /usr/lib/x86_64-linux-gnu]}\n  mounts:\n  - {hostPath: "
                        "/usr/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1}\n"));
  auto specs = load_cdi_specs({(dir / "cdi").string()}, {"nvidia.com/gpu"});
  ASSERT_TRUE(specs) << specs.error().message;
  Json oci = minimal_oci();
  ASSERT_TRUE(
      apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/")));  // what containerd did
  ASSERT_TRUE(
      apply_cdi_devices(oci, *specs, {"nvidia.com/gpu=0"}, HostFs("/")));  // and then the runtime
  EXPECT_EQ(oci["hooks"]["createContainer"].size(), 1u) << "ldconfig would run twice";
  EXPECT_EQ(oci["mounts"].size(), 1u);
}
