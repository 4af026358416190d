// CDI: the ld.so.cache reader, spec generation on fake driver trees, and validation.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

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
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mknod the fake GPU nodes the spec lists";
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

TEST(CdiGenerate, TheLdcacheHookHasAnAbsolutePathAMinimalEnvAndATimeout) {
  test::TempDir root;
  root.write("usr/lib/x86_64-linux-gnu/libcuda.so.1", "elf");
  auto r = generate_cdi_spec(HostFs(root.path()), two_gpus(), "550.54.15", {});
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->spec.edits.hooks.size(), 1u);
  const auto& hook = r->spec.edits.hooks[0];
  EXPECT_TRUE(hook.path.starts_with("/")) << hook.path;
  // Without env, runc runs a createContainer hook with the container's environment.
  EXPECT_EQ(hook.env, (std::vector<std::string>{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}));
  ASSERT_TRUE(hook.timeout);
  EXPECT_GT(*hook.timeout, 0);
  CdiGenerateOptions relative;
  relative.hook_path = "gpufence-runtime";
  auto bad = generate_cdi_spec(HostFs(root.path()), two_gpus(), "550.54.15", relative);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("must be absolute"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The CDI project's rules, one test each; docs/cdi.md names the upstream source of every rule.

namespace {

// A valid spec; tests change one thing in it.
const std::string kOk =
    "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    "
    "deviceNodes:\n    - path: /dev/nvidia0\n";

std::string error_of(const std::string& text) {
  auto s = parse_cdi_spec(text, "t.yaml");
  return s ? std::string("(valid)") : s.error().message;
}

std::string with(const std::string& from, const std::string& to, std::string base = kOk) {
  auto at = base.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) base.replace(at, from.size(), to);
  return error_of(base);
}

std::string with_text(const std::string& from, const std::string& to, std::string base = kOk) {
  auto at = base.find(from);
  if (at != std::string::npos) base.replace(at, from.size(), to);
  return base;
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

}  // namespace

TEST(CdiSpecRules, TheBaseSpecIsValid) {
  EXPECT_EQ(error_of(kOk), "(valid)");
}

// upstream isEmpty: "valid in a global Spec context but invalid in a Device context".
TEST(CdiSpecRules, EmptySpecWideContainerEditsAreValidEmptyDeviceEditsAreNot) {
  EXPECT_EQ(error_of(kOk + "containerEdits:\n"), "(valid)");
  EXPECT_EQ(error_of(kOk + "containerEdits: {}\n"), "(valid)");
  EXPECT_EQ(error_of(kOk + "containerEdits:\n  env: []\n  mounts:\n"), "(valid)");
  EXPECT_HAS(with("  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n",
                  "  containerEdits: {}\n"),
             "device '0' has no containerEdits");
  EXPECT_HAS(with("  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n", ""),
             "device '0' has no containerEdits");
}

// upstream DeviceNode.Validate: "" (rwm), "none" (no access), or letters of rwm.
TEST(CdiSpecRules, PermissionsAcceptEmptyNoneAndRwmLetters) {
  for (const std::string p : {"\"\"", "none", "r", "rw", "mrw", "rwmrw", "~"}) {
    EXPECT_EQ(
        with("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      permissions: " + p + "\n"),
        "(valid)")
        << p;
  }
  EXPECT_EQ(with("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      permissions:\n"),
            "(valid)");
  for (const std::string p : {"rwx", "None", "rw m", "all"}) {
    EXPECT_HAS(
        with("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      permissions: " + p + "\n"),
        "may hold only r, w, m");
  }
}

// upstream ValidateEnv, applied to edits and (Hook.Validate) to each hook's env.
TEST(CdiSpecRules, EnvEntriesOfEditsAndHooksMustBeKeyValue) {
  EXPECT_HAS(error_of(kOk + "containerEdits:\n  env: [NOEQUALS]\n"), "is not KEY=VALUE");
  EXPECT_HAS(error_of(kOk + "containerEdits:\n  env: [\"=x\"]\n"), "is not KEY=VALUE");
  EXPECT_EQ(error_of(kOk + "containerEdits:\n  env: [\"A=\"]\n"), "(valid)");
  const std::string hook = kOk +
                           "containerEdits:\n  hooks:\n  - hookName: createContainer\n    path: "
                           "/bin/true\n    env: [";
  EXPECT_EQ(error_of(hook + "\"PATH=/bin\"]\n"), "(valid)");
  auto bad = error_of(hook + "PATH]\n");
  EXPECT_HAS(bad, "hooks[0]: env entry 'PATH' is not KEY=VALUE");
  EXPECT_HAS(error_of(hook + "\"=/bin\"]\n"), "is not KEY=VALUE");
}

// specs-go requiresV060: "The v0.6.0 spec allows dots "." in Kind name label (class)".
TEST(CdiSpecRules, DotsInTheClassAreValidFromVersion060) {
  const std::string dotted =
      "kind: example.com/net.device\ndevices:\n- name: eth0\n  containerEdits:\n    env: [A=1]\n";
  EXPECT_HAS(error_of("cdiVersion: 0.5.0\n" + dotted),
             "too old for what the spec uses (needs 0.6.0)");
  EXPECT_EQ(error_of("cdiVersion: 0.6.0\n" + dotted), "(valid)");
  EXPECT_EQ(error_of("cdiVersion: 1.1.0\n" + dotted), "(valid)");
  // Dots in the vendor were always allowed.
  EXPECT_EQ(error_of("cdiVersion: 0.3.0\nkind: example.com/net\ndevices:\n- name: eth0\n  "
                     "containerEdits:\n    env: [A=1]\n"),
            "(valid)");
}

TEST(CdiSpecRules, MinimumVersionIsTheNewestFeatureUsed) {
  auto base = [] {
    CdiSpec s;
    s.kind = "nvidia.com/gpu";
    CdiContainerEdits e;
    e.env.push_back("A=1");
    s.devices.push_back({"gpu0", {}, e});
    return s;
  };
  struct Case {
    const char* what;
    void (*change)(CdiSpec&);
    const char* want;
  };
  const std::vector<Case> cases = {
      {"nothing", [](CdiSpec&) {}, "0.3.0"},
      {"mount type",
       [](CdiSpec& s) {
         s.edits.mounts.push_back({"/a", "/a", {}, "bind"});
       },
       "0.4.0"},
      {"device node hostPath",
       [](CdiSpec& s) {
         s.devices[0].edits.device_nodes.push_back(
             {"/dev/x", "/dev/y", "", {}, {}, {}, "", {}, {}});
       },
       "0.5.0"},
      {"device name starting with a digit", [](CdiSpec& s) { s.devices[0].name = "0"; }, "0.5.0"},
      {"spec annotations", [](CdiSpec& s) { s.annotations["a"] = "b"; }, "0.6.0"},
      {"device annotations", [](CdiSpec& s) { s.devices[0].annotations["a"] = "b"; }, "0.6.0"},
      {"dot in the class", [](CdiSpec& s) { s.kind = "nvidia.com/gpu.mig"; }, "0.6.0"},
      {"dot in the vendor only", [](CdiSpec& s) { s.kind = "a.b.c/gpu"; }, "0.3.0"},
      {"additionalGids", [](CdiSpec& s) { s.edits.additional_gids = {44}; }, "0.7.0"},
      {"intelRdt", [](CdiSpec& s) { s.devices[0].edits.intel_rdt = CdiIntelRdt{}; }, "0.7.0"},
      {"intelRdt schemata",
       [](CdiSpec& s) {
         s.edits.intel_rdt = CdiIntelRdt{};
         s.edits.intel_rdt->schemata = std::vector<std::string>{};
       },
       "1.1.0"},
      {"intelRdt enableMonitoring",
       [](CdiSpec& s) {
         s.edits.intel_rdt = CdiIntelRdt{};
         s.edits.intel_rdt->enable_monitoring = true;
       },
       "1.1.0"},
      {"netDevices",
       [](CdiSpec& s) {
         s.devices[0].edits.net_devices.push_back({"eth1", "net0"});
       },
       "1.1.0"},
      {"netDevices beats annotations",
       [](CdiSpec& s) {
         s.annotations["a"] = "b";
         s.edits.net_devices.push_back({"eth1", "net0"});
       },
       "1.1.0"},
  };
  for (const auto& c : cases) {
    CdiSpec s = base();
    c.change(s);
    EXPECT_EQ(minimum_cdi_version(s), c.want) << c.what;
    // And validation agrees: the minimum is accepted, the version below it is not.
    s.cdi_version = c.want;
    EXPECT_TRUE(validate_cdi_spec(s)) << c.what << ": " << validate_cdi_spec(s).error().message;
    auto it = std::find(kCdiVersions.begin(), kCdiVersions.end(), c.want);
    if (it != kCdiVersions.begin() && std::string(c.want) != "0.3.0") {
      s.cdi_version = *(it - 1);
      EXPECT_FALSE(validate_cdi_spec(s)) << c.what << " at " << s.cdi_version;
    }
  }
}

// specs-go: every released version is known; vEarliest is 0.3.0; a leading "v" is accepted.
TEST(CdiSpecRules, VersionsKnownEarliestAndLeadingV) {
  EXPECT_HAS(with("0.5.0", "2.0.0"), "is not a CDI version");
  EXPECT_HAS(with("0.5.0", "0.5"), "is not a CDI version");
  EXPECT_EQ(with("0.5.0", "v0.5.0"), "(valid)");
  EXPECT_EQ(with("0.5.0", "1.0.0"), "(valid)");
  const std::string letters =
      "kind: nvidia.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n    env: [A=1]\n";
  EXPECT_EQ(error_of("cdiVersion: 0.3.0\n" + letters), "(valid)");
  EXPECT_HAS(error_of("cdiVersion: 0.2.0\n" + letters), "needs 0.3.0");
  EXPECT_HAS(error_of("cdiVersion: 0.1.0\n" + letters), "needs 0.3.0");
}

// pkg/parser validateVendorOrClassName.
TEST(CdiSpecRules, VendorAndClassNames) {
  for (const char* v : {"nvidia.com", "a", "Vendor1", "x-y_z.w", "a.b.c"})
    EXPECT_TRUE(valid_cdi_vendor(v)) << v;
  for (const char* v : {"", "1nvidia", "nvidia.", "-nvidia", "nv idia", "nv/idia", "nvidia_"})
    EXPECT_FALSE(valid_cdi_vendor(v)) << v;
  for (const char* c : {"gpu", "gpu.mig", "Class_2", "c-1"}) EXPECT_TRUE(valid_cdi_class(c)) << c;
  for (const char* c : {"", "-gpu", "gpu-", "gpu/x", "9gpu", "gpu."})
    EXPECT_FALSE(valid_cdi_class(c)) << c;
  EXPECT_HAS(with("nvidia.com/gpu", "nvidia.com"), "is not vendor/class");
  EXPECT_HAS(with("nvidia.com/gpu", "-x/gpu"), "vendor '-x' must start with a letter");
  EXPECT_HAS(with("nvidia.com/gpu", "nvidia.com/gpu/x"), "class 'gpu/x'");
  EXPECT_HAS(with("nvidia.com/gpu", "nvidia.com/"), "is not vendor/class");
}

// pkg/parser ValidateDeviceName.
TEST(CdiSpecRules, DeviceNames) {
  for (const char* n :
       {"0", "all", "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01", "mig-1g.5gb", "a:b", "a_b", "A"})
    EXPECT_TRUE(valid_cdi_device_name(n)) << n;
  for (const char* n : {"", "-a", "a-", "a b", "a/b", "a=b", ":a", "a:", "_a", "é"})
    EXPECT_FALSE(valid_cdi_device_name(n)) << n;
  EXPECT_HAS(with("name: \"0\"", "name: \"bad name\""), "device name 'bad name' is invalid");
  EXPECT_HAS(error_of(kOk + "- name: \"0\"\n  containerEdits:\n    env: [A=1]\n"), "defined twice");
  EXPECT_HAS(error_of("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"), "spec has no devices");
  EXPECT_HAS(error_of("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n"),
             "spec has no devices");
}

// upstream DeviceNode.Validate (type, negative numbers), Mount.Validate, Hook.Validate, plus OCI's
// absolute paths and positive hook timeouts.
TEST(CdiSpecRules, NodesMountsAndHooks) {
  const std::string node = "- path: /dev/nvidia0\n";
  auto node_with = [&](const std::string& extra) {
    return with(node, node + "      " + extra + "\n");
  };
  EXPECT_EQ(node_with("type: c"), "(valid)");
  EXPECT_HAS(node_with("type: x"), "type 'x' is not b, c, u or p");
  EXPECT_EQ(node_with("major: 195"), "(valid)");
  EXPECT_HAS(node_with("major: -1"), "must not be negative");
  EXPECT_HAS(node_with("minor: -3"), "must not be negative");
  EXPECT_HAS(with("/dev/nvidia0", "dev/nvidia0"), "path 'dev/nvidia0' must be absolute");
  EXPECT_HAS(node_with("hostPath: dev/x"), "hostPath 'dev/x' must be absolute");
  const std::string mounts = kOk + "containerEdits:\n  mounts:\n  - ";
  EXPECT_EQ(error_of(mounts + "{hostPath: /a, containerPath: /b}\n"), "(valid)");
  EXPECT_HAS(error_of(mounts + "{hostPath: \"\", containerPath: /b}\n"), "hostPath is empty");
  EXPECT_HAS(error_of(mounts + "{hostPath: /a, containerPath: b}\n"), "must be absolute");
  EXPECT_HAS(error_of(mounts + "{containerPath: /b}\n"), "mounts[0].hostPath is required");
  const std::string hooks = kOk + "containerEdits:\n  hooks:\n  - ";
  EXPECT_EQ(error_of(hooks + "{hookName: poststop, path: /bin/true, timeout: 5}\n"), "(valid)");
  EXPECT_HAS(error_of(hooks + "{hookName: whenever, path: /bin/true}\n"),
             "unknown hookName 'whenever'");
  EXPECT_HAS(error_of(hooks + "{hookName: prestart, path: bin/true}\n"), "must be absolute");
  EXPECT_HAS(error_of(hooks + "{hookName: prestart, path: /bin/true, timeout: 0}\n"),
             "timeout must be greater than zero");
}

// k8s IsQualifiedName on annotation keys (CDI ValidateSpecAnnotations).
TEST(CdiSpecRules, AnnotationKeysAreQualifiedNames) {
  const std::string head = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\nannotations:\n  ";
  const std::string rest = "\ndevices:\n- name: gpu0\n  containerEdits:\n    env: [A=1]\n";
  EXPECT_EQ(error_of(head + "example.com/owner: me" + rest), "(valid)");
  EXPECT_EQ(error_of(head + "Owner_1: me" + rest), "(valid)");
  EXPECT_HAS(error_of(head + "\"bad key\": x" + rest), "is not a qualified name");
  EXPECT_HAS(error_of(head + "a/b/c: x" + rest), "is not a qualified name");
  EXPECT_HAS(error_of(head + "\"-x\": y" + rest), "is not a qualified name");
  EXPECT_HAS(error_of(head + "a: 5" + rest), "annotations.a must be a string");
}

// The fields upstream has and gpufence does not apply are still read and validated.
TEST(CdiSpecRules, AdditionalGidsIntelRdtAndNetDevicesAreSpecFields) {
  const std::string spec =
      "cdiVersion: 1.1.0\nkind: example.com/nic\ncontainerEdits:\n  additionalGids: [44, 107]\n"
      "devices:\n- name: nic0\n  containerEdits:\n    netDevices:\n    - {hostInterfaceName: "
      "eth1, name: net0}\n    intelRdt: {closID: gold, schemata: [\"L3:0=ff\"]}\n";
  auto s = parse_cdi_spec(spec, "t.yaml");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->edits.additional_gids, (std::vector<std::uint32_t>{44, 107}));
  ASSERT_EQ(s->devices[0].edits.net_devices.size(), 1u);
  EXPECT_EQ(s->devices[0].edits.net_devices[0].host_interface_name, "eth1");
  ASSERT_TRUE(s->devices[0].edits.intel_rdt);
  EXPECT_EQ(s->devices[0].edits.intel_rdt->clos_id, "gold");
  // Round trip through both writers.
  auto back = parse_cdi_spec(cdi_spec_to_yaml(*s), "yaml");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(cdi_spec_to_json(*back), cdi_spec_to_json(*s));
  // Their rules.
  EXPECT_HAS(with("closID: gold", "closID: ..", spec), "closID '..' is not a valid file name");
  EXPECT_HAS(with("name: net0}", "name: net0}\n    - {hostInterfaceName: eth2, name: net0}", spec),
             "name 'net0' twice");
  EXPECT_HAS(with("additionalGids: [44, 107]", "additionalGids: [-1]", spec),
             "additionalGids[0] must be an integer from 0 to 4294967295");
  EXPECT_HAS(with("closID: gold,", "closID: gold, enableCMT: true,", spec),
             "enableCMT and enableMBM are not valid from 1.1.0");
  EXPECT_HAS(with("1.1.0", "1.0.0", spec), "needs 1.1.0");
}

// Upstream reads with yaml.UnmarshalStrict: a field the schema does not have is an error.
TEST(CdiSpecRules, UnknownFieldsAreErrorsNamingThePath) {
  EXPECT_HAS(error_of(kOk + "containerEdits:\n  devices: []\n"),
             "containerEdits.devices is not a field of the CDI spec");
  EXPECT_HAS(with("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      mode: 666\n"),
             "devices[0].containerEdits.deviceNodes[0].mode is not a field of the CDI spec");
  EXPECT_HAS(error_of(kOk + "extra: 1\n"), "extra is not a field of the CDI spec");
}

// Malformed input gets an error naming the field: never an exception's text.
TEST(CdiSpecRules, WrongTypesNameTheField) {
  struct Case {
    std::string text, want;
  };
  const std::vector<Case> cases = {
      {with_text("name: \"0\"", "name: 0"), "devices[0].name must be a string, not a number"},
      {with_text("    deviceNodes:\n    - path: /dev/nvidia0\n", "    deviceNodes: 5\n"),
       "devices[0].containerEdits.deviceNodes must be a list, not a number"},
      {with_text("    - path: /dev/nvidia0\n", "    - /dev/nvidia0\n"),
       "devices[0].containerEdits.deviceNodes[0] must be a map, not a string"},
      {with_text("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      major: x\n"),
       "deviceNodes[0].major must be an integer"},
      {with_text("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      uid: -1\n"),
       "deviceNodes[0].uid must be an integer from 0 to 4294967295, not -1"},
      {with_text("- path: /dev/nvidia0\n", "- path: /dev/nvidia0\n      fileMode: 1.5\n"),
       "deviceNodes[0].fileMode must be an integer"},
      {with_text("- path: /dev/nvidia0\n", "- path: [a]\n"),
       "deviceNodes[0].path must be a string, not a list"},
      {kOk + "containerEdits: [a]\n", "containerEdits must be a map, not a list"},
      {kOk + "containerEdits:\n  env: [1]\n", "containerEdits.env[0] must be a string"},
      {kOk + "containerEdits:\n  hooks: [{hookName: prestart, path: /x, timeout: 99999999999}]\n",
       "hooks[0].timeout must be an integer from"},
      {"{\"cdiVersion\": \"0.5.0\", \"kind\": \"nvidia.com/gpu\", \"devices\": [{\"name\": \"0\", "
       "\"containerEdits\": {\"mounts\": [{\"hostPath\": 5, \"containerPath\": \"/x\"}]}}]}",
       "devices[0].containerEdits.mounts[0].hostPath must be a string, not a number"},
      {"{\"cdiVersion\": 0.5, \"kind\": \"nvidia.com/gpu\"}", "cdiVersion must be a string"},
      {"kind: nvidia.com/gpu\ndevices: []\n", "cdiVersion is required"},
      {"- just\n- a list\n", "expected a map"},
      {"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: {name: x}\n", "devices must be a list"},
  };
  for (const auto& c : cases) {
    std::string e = error_of(c.text);
    EXPECT_HAS(e, c.want);
    EXPECT_TRUE(e.starts_with("t.yaml: ")) << e;
    EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
    EXPECT_EQ(e.find("internal"), std::string::npos) << e;
  }
  auto syntax = error_of("cdiVersion: 0.5.0\nkind: [unclosed\n");
  EXPECT_HAS(syntax, "t.yaml:");
  auto json = parse_cdi_spec("{\"cdiVersion\": \"0.5.0\",, }", "t.json");
  ASSERT_FALSE(json);
  std::string json_syntax = json.error().message;
  EXPECT_HAS(json_syntax, "t.json: not JSON: parse error at line 1, column 24");
  EXPECT_EQ(json_syntax.find("json.exception"), std::string::npos) << json_syntax;
  // A number that overflows a double is nlohmann's out_of_range, not a parse_error: it escaped
  // as an exception (fuzzer: tests/fuzz/corpus/cdi_spec/crash-number-overflow).
  auto overflow =
      parse_cdi_spec("{\"cdiVersion\": 5E99999, \"kind\": \"nvidia.com/gpu\"}", "t.json");
  ASSERT_FALSE(overflow);
  EXPECT_HAS(overflow.error().message, "t.json: not JSON: number overflow");
  EXPECT_FALSE(parse_cdi_spec("{\"cdiVersion\": 5E99999}", "t.yaml")) << "nor as YAML";
}

TEST(CdiSpecRules, JsonAndYamlReadTheSame) {
  auto yaml = parse_cdi_spec(kOk, "y");
  ASSERT_TRUE(yaml);
  auto json = parse_cdi_spec(cdi_spec_to_json(*yaml).dump(), "j");
  ASSERT_TRUE(json) << json.error().message;
  EXPECT_EQ(cdi_spec_to_json(*json), cdi_spec_to_json(*yaml));
  // A string that looks like a negative number survives the YAML writer.
  CdiSpec s = *yaml;
  s.edits.hooks.push_back({"poststop", "/bin/echo", {"echo", "-1", "--x", "null"}, {}, 3});
  auto back = parse_cdi_spec(cdi_spec_to_yaml(s), "y2");
  ASSERT_TRUE(back) << back.error().message << "\n" << cdi_spec_to_yaml(s);
  EXPECT_EQ(back->edits.hooks[0].args, s.edits.hooks[0].args);
}

// A spec in the shape NVIDIA's toolkit writes reads strictly, and its argument strings survive.
TEST(CdiSpecRules, AToolkitShapedSpecIsValid) {
  auto s = parse_cdi_spec(fixture("nvidia-ctk-shaped.yaml"), "nvidia-ctk-shaped.yaml");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->devices.size(), 3u);
  EXPECT_EQ(s->devices[0].name, "0");
  ASSERT_EQ(s->devices[0].edits.hooks.size(), 2u);
  EXPECT_EQ(s->devices[0].edits.hooks[0].args[3],
            "../card1::/dev/dri/by-path/pci-0000:01:00.0-card");
  EXPECT_EQ(s->devices[0].edits.hooks[1].args[3], "755");
  EXPECT_TRUE(s->devices[0].edits.hooks[0].env.empty());
  EXPECT_EQ(minimum_cdi_version(*s), "0.5.0");
}

// yaml.UnmarshalStrict refuses a key given twice; so do both readers here.
TEST(CdiSpecRules, DuplicateKeysAreErrors) {
  auto yaml = error_of(kOk + "kind: other.example/x\n");
  EXPECT_HAS(yaml, "duplicate key 'kind'");
  EXPECT_HAS(yaml, "t.yaml:");
  auto json = parse_cdi_spec(
      "{\"cdiVersion\": \"0.5.0\", \"kind\": \"nvidia.com/gpu\", \"devices\": [{\"name\": \"0\", "
      "\"name\": \"1\", \"containerEdits\": {\"env\": [\"A=1\"]}}]}",
      "t.json");
  ASSERT_FALSE(json);
  EXPECT_HAS(json.error().message, "t.json: duplicate key 'name'");
  // The same key in sibling objects is fine.
  EXPECT_TRUE(
      parse_cdi_spec("{\"cdiVersion\": \"0.5.0\", \"kind\": \"nvidia.com/gpu\", \"devices\": "
                     "[{\"name\": \"0\", \"containerEdits\": {\"env\": [\"A=1\"]}}, {\"name\": "
                     "\"1\", \"containerEdits\": {\"env\": [\"A=1\"]}}]}",
                     "t.json"));
}

namespace {

struct Run {
  int rc;
  std::string out;
};

Run run_gpufence(const std::string& args) {
  std::string cmd = test::bin_path("gpufence") + " " + args + " 2>&1";
  Run r{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST(CdiValidateCommand, ValidSpecsPassWithNotesAndBadOnesNameTheField) {
  test::TempDir dir;
  auto bad = dir.write("bad.yaml", with_text("name: \"0\"", "name: 0"));
  auto foreign = dir.write(
      "net.yaml",
      "cdiVersion: 0.6.0\nkind: example.com/net.dev\ncontainerEdits:\ndevices:\n- name: eth0\n"
      "  containerEdits:\n    env: [A=1]\n");
  auto ok = run_gpufence("cdi validate " +
                         test::source_path("tests/fixtures/cdi/nvidia-ctk-shaped.yaml") + " " +
                         foreign.string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_HAS(ok.out, "valid: " + foreign.string() +
                         " (cdiVersion 0.6.0, kind example.com/net.dev, 1 devices)");
  EXPECT_HAS(ok.out, "note: hook /usr/bin/nvidia-cdi-hook has no env");
  auto r = run_gpufence("cdi validate " + bad.string() + " " + foreign.string());
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_HAS(r.out, "invalid: " + bad.string() + ": devices[0].name must be a string");
  EXPECT_HAS(r.out, "valid: " + foreign.string());
}
