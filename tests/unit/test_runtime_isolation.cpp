// The spec edit and the device-rule meaning, on literal config.json fragments.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <map>

#include "common/file.hpp"
#include "runtime/allocation.hpp"
#include "runtime/device_rules.hpp"
#include "runtime/host_devices.hpp"
#include "runtime/isolation.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

constexpr const char* kProcDevices =
    "Character devices:\n  1 mem\n  4 tty\n  5 /dev/tty\n 10 misc\n136 pts\n195 nvidia-frontend\n"
    "226 drm\n510 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n";

IsolationPlan grant_gpu1() {
  IsolationPlan plan;
  plan.grant = {
      {"/dev/nvidia1", 195, 1}, {"/dev/nvidiactl", 195, 255}, {"/dev/nvidia-uvm", 511, 0}};
  auto devices = parse_proc_devices(kProcDevices);
  EXPECT_TRUE(devices);
  plan.reserved_majors = nvidia_reserved_majors(*devices);
  for (const auto& m : devices->character) plan.host_majors.character.push_back(m.major);
  for (const auto& m : devices->block) plan.host_majors.block.push_back(m.major);
  plan.uuids = {"GPU-bbb"};
  return plan;
}

// What containerd's CRI writes for a privileged container: every host device, allow-all.
Json privileged_spec() {
  return Json::parse(R"({
    "ociVersion": "1.0.2-dev",
    "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
                "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}},
    "root": {"path": "rootfs"},
    "hostname": "x",
    "mounts": [{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "rw"]}],
    "linux": {
      "devices": [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-caps/nvidia-cap1", "type": "c", "major": 510, "minor": 1},
        {"path": "/dev/dri/card0", "type": "c", "major": 226, "minor": 0},
        {"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2},
        {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
        {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}
      ],
      "resources": {"devices": [{"allow": true, "access": "rwm"}]},
      "namespaces": [{"type": "pid"}]
    }
  })");
}

std::vector<DeviceRule> rules_of(const Json& spec) {
  auto r = parse_spec_device_rules(spec);
  EXPECT_TRUE(r) << r.error().message;
  return r ? *r : std::vector<DeviceRule>{};
}

std::vector<std::string> device_paths(const Json& spec) {
  std::vector<std::string> out;
  for (const auto& d : spec["linux"]["devices"]) out.push_back(d["path"]);
  return out;
}

}  // namespace

TEST(DeviceRules, MeaningFollowsTheOciSpec) {
  auto r = parse_device_rule(Json::parse(R"({"allow": true, "type": "c", "major": 195})"), "x");
  ASSERT_TRUE(r);
  EXPECT_EQ(describe_device_rule(*r), "allow c 195:* rwm");
  auto minus_one =
      parse_device_rule(Json::parse(R"({"allow": true, "major": -1, "minor": null})"), "x");
  ASSERT_TRUE(minus_one);
  EXPECT_FALSE(minus_one->major) << "-1 is runc's wildcard";
  EXPECT_EQ(minus_one->type, 'a');
  std::vector<DeviceRule> rules = {
      *minus_one, {false, 'c', 195u, std::nullopt, "rw"}, {true, 'c', 195u, 1u, "r"}};
  EXPECT_FALSE(rules_allow_open(rules, 195, 0));
  EXPECT_TRUE(rules_allow_open(rules, 195, 1)) << "last matching rule wins, per access bit";
  EXPECT_EQ(effective_access(rules, 'c', 195, 1), "rm");
  EXPECT_EQ(effective_access(rules, 'c', 195, 0), "m");
  EXPECT_TRUE(rules_allow_open(rules, 10, 229));
  EXPECT_FALSE(rules_allow_open({}, 1, 3)) << "the default is deny";
}

TEST(DeviceRules, BadRulesAreNamed) {
  EXPECT_EQ(parse_device_rule(Json::parse(R"({"allow": "yes"})"), "r[2]").error().message,
            "r[2].allow must be a boolean");
  EXPECT_EQ(
      parse_device_rule(Json::parse(R"({"allow": true, "major": "195"})"), "r[0]").error().message,
      "r[0].major must be an integer or null");
  EXPECT_EQ(
      parse_device_rule(Json::parse(R"({"allow": true, "access": "rwx"})"), "r[1]").error().message,
      "r[1].access 'rwx' is not a subset of rwm");
  EXPECT_FALSE(parse_device_rule(Json::parse(R"({"allow": true, "type": "p"})"), "r"));
}

TEST(HostDevices, ProcDevicesAndReservedMajors) {
  auto d = parse_proc_devices(kProcDevices);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->character.size(), 9u);
  EXPECT_EQ(d->block.size(), 3u);
  EXPECT_EQ(d->character[2].name, "/dev/tty");
  EXPECT_EQ(nvidia_reserved_majors(*d), (std::set<unsigned>{195, 226, 510, 511}));
  EXPECT_FALSE(parse_proc_devices("Character devices:\nxx mem\n"));
  EXPECT_FALSE(parse_proc_devices("1 mem\n")) << "a line before any section";
  EXPECT_FALSE(parse_proc_devices(""));
}

// The real reader: one lstat per path the query names, so a link planted at a node's path is not
// followed to another GPU's node; a path the query did not name is no fact at all.
TEST(HostDevices, FactsHoldWhatTheQueryNamedAndNothingMore) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mknod fake GPU nodes (195:N)";
  test::TempDir root;
  root.write("proc/devices", kProcDevices);
  std::filesystem::create_directories(root / "dev");
  for (unsigned i = 0; i < 2; ++i) {
    auto path = root / ("dev/nvidia" + std::to_string(i));
    ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0666, makedev(195, i)), 0) << path;
  }
  std::filesystem::create_symlink("nvidia0", root / "dev/gpu-link");
  root.write("dev/plain", "");
  root.write("sys/devices/pci0000:00/0000:01:00.0/vendor", "0x10de\n");
  root.write("sys/class/drm/card1/dev", "226:1\n");
  std::filesystem::create_symlink("../../../devices/pci0000:00/0000:01:00.0",
                                  root / "sys/class/drm/card1/device");
  const HostFs host(root.path());

  HostDeviceQuery query;
  query.char_paths = {"/dev/nvidia1", "/dev/gpu-link", "/dev/plain", "/dev/missing"};
  auto facts = read_host_device_facts(host, query);
  ASSERT_TRUE(facts.registered);
  auto gpu1 = facts.char_device("/dev/nvidia1", "/dev/in-container");
  ASSERT_TRUE(gpu1) << gpu1.error().message;
  EXPECT_EQ(gpu1->path, "/dev/in-container");
  EXPECT_EQ(std::pair(gpu1->major, gpu1->minor), std::pair(195u, 1u));
  EXPECT_FALSE(facts.char_device("/dev/gpu-link", "/dev/gpu-link")) << "a link is not GPU 0";
  EXPECT_FALSE(facts.char_device("/dev/plain", "/dev/plain"));
  EXPECT_FALSE(facts.char_device("/dev/missing", "/dev/missing"));
  auto unread = facts.char_device("/dev/nvidia0", "/dev/nvidia0");
  ASSERT_FALSE(unread) << "the query did not name it";
  EXPECT_NE(unread.error().message.find("not read"), std::string::npos) << unread.error().message;
  EXPECT_TRUE(facts.drm_nodes.empty()) << "the query did not ask for DRM nodes";

  query.drm_nodes = true;
  facts = read_host_device_facts(host, query);
  ASSERT_EQ(facts.drm_nodes.size(), 1u);
  EXPECT_EQ(facts.drm_nodes[0].pci_bus_id, "0000:01:00.0");
  EXPECT_TRUE(facts.drm_nodes[0].nvidia);

  std::filesystem::remove(root / "proc/devices");
  EXPECT_FALSE(read_host_device_facts(host, query).registered);
}

TEST(Isolation, PrivilegedSpecBecomesAWhitelistThatGrantsOnlyTheGpu) {
  Json spec = privileged_spec();
  IsolationPlan plan = grant_gpu1();
  plan.keep = {{226, 2}};  // card2 belongs to another vendor's GPU
  auto r = isolate_spec(spec, plan);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->changed);
  EXPECT_TRUE(r->whitelisted);
  EXPECT_EQ(device_paths(spec),
            (std::vector<std::string>{"/dev/dri/card2", "/dev/fuse", "/dev/sda", "/dev/nvidia1",
                                      "/dev/nvidiactl", "/dev/nvidia-uvm"}));
  auto rules = rules_of(spec);
  ASSERT_FALSE(rules.empty());
  EXPECT_EQ(rules[0], (DeviceRule{false, 'a', std::nullopt, std::nullopt, "rwm"}));
  for (size_t i = 1; i < rules.size(); ++i) {
    EXPECT_TRUE(rules[i].allow) << "no deny after the first rule: "
                                << describe_device_rule(rules[i]);
    if (!rules[i].major) {
      EXPECT_EQ(rules[i].access, "m") << describe_device_rule(rules[i]);
    }
  }
  EXPECT_TRUE(rules_allow_open(rules, 195, 1));
  EXPECT_TRUE(rules_allow_open(rules, 195, 255));
  EXPECT_TRUE(rules_allow_open(rules, 511, 0));
  EXPECT_FALSE(rules_allow_open(rules, 195, 0));
  EXPECT_FALSE(rules_allow_open(rules, 195, 7)) << "a GPU node nvidia-modprobe creates later";
  EXPECT_FALSE(rules_allow_open(rules, 195, 254)) << "nvidia-modeset was not granted";
  EXPECT_FALSE(rules_allow_open(rules, 226, 0));
  EXPECT_TRUE(rules_allow_open(rules, 226, 2));
  EXPECT_FALSE(rules_allow_open(rules, 510, 1)) << "nvidia-caps";
  EXPECT_TRUE(rules_allow_open(rules, 10, 229));
  EXPECT_TRUE(rules_allow_open(rules, 4, 63)) << "every registered major stays open";
  EXPECT_TRUE(effective_access(rules, 'b', 8, 3).find('r') != std::string::npos);
  EXPECT_EQ(effective_access(rules, 'c', 195, 0), "m") << "mknod stays allowed, open does not";
  // The cgroup filesystem is mounted read-only.
  EXPECT_EQ(spec["mounts"][0]["options"],
            Json::parse(R"(["nosuid", "noexec", "nodev", "relatime", "ro"])"));
  EXPECT_EQ(get_env(spec, "NVIDIA_VISIBLE_DEVICES"), "GPU-bbb");
  EXPECT_EQ(get_env(spec, "CUDA_VISIBLE_DEVICES"), "GPU-bbb");
  std::vector<std::string> keys;
  for (const auto& [k, v] : spec.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"ociVersion", "process", "root", "hostname", "mounts",
                                            "linux"}))
      << "untouched fields stay, in order";
}

TEST(Isolation, DenyAfterAllowAllIsKeptByListingNodes) {
  Json spec = privileged_spec();
  spec["linux"]["resources"]["devices"] = Json::parse(R"([
    {"allow": true, "access": "rwm"},
    {"allow": false, "type": "c", "major": 10, "minor": 229, "access": "rwm"}])");
  spec["linux"]["devices"].push_back(
      Json::parse(R"({"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200})"));
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_TRUE(r) << r.error().message;
  auto rules = rules_of(spec);
  EXPECT_FALSE(rules_allow_open(rules, 10, 229)) << "the spec's own deny survives";
  EXPECT_TRUE(rules_allow_open(rules, 10, 200)) << "listed nodes of that major stay open";
  EXPECT_TRUE(rules_allow_open(rules, 4, 1));
}

TEST(Isolation, WildcardCharAllowInADefaultDenySpecIsNarrowedToo) {
  Json spec = Json::parse(R"({"linux": {"resources": {"devices": [
      {"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "access": "rwm"}]}}})");
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_TRUE(r) << r.error().message;
  auto rules = rules_of(spec);
  EXPECT_FALSE(rules_allow_open(rules, 195, 0));
  EXPECT_TRUE(rules_allow_open(rules, 195, 1));
  EXPECT_TRUE(rules_allow_open(rules, 136, 3));
  EXPECT_FALSE(effective_access(rules, 'b', 8, 0).find('r') != std::string::npos)
      << "the spec gave no block devices";
}

TEST(Isolation, DefaultDenySpecLosesAllowsForReservedMajorsOnly) {
  Json spec = Json::parse(R"({
    "process": {"env": []},
    "linux": {"resources": {"devices": [
      {"allow": false, "access": "rwm"},
      {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"},
      {"allow": true, "type": "c", "major": 195, "access": "rw"},
      {"allow": true, "type": "c", "major": 510, "access": "rw"},
      {"allow": true, "type": "c", "access": "m"},
      {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
    ]}}
  })");
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(r->whitelisted);
  EXPECT_EQ(r->removed_rules, 3u);
  auto rules = rules_of(spec);
  EXPECT_EQ(rules.size(), 6u);  // deny-all, c *:* m, 1:3, then 195:1, 195:255, 511:0
  EXPECT_EQ(describe_device_rule(rules[1]), "allow c *:* m");
  EXPECT_EQ(describe_device_rule(rules[3]), "allow c 195:1 rwm");
  EXPECT_FALSE(rules_allow_open(rules, 195, 0));
  EXPECT_FALSE(rules_allow_open(rules, 510, 1));
}

TEST(Isolation, KubeletDeviceSpecForTheGrantedGpuIsKept) {
  Json spec = Json::parse(R"({"linux": {
    "devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}],
    "resources": {"devices": [{"allow": false, "access": "rwm"},
      {"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rw"}]}}})");
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_TRUE(r);
  auto rules = rules_of(spec);
  EXPECT_TRUE(rules_allow_open(rules, 195, 1));
  EXPECT_EQ(device_paths(spec),
            (std::vector<std::string>{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}));
}

TEST(Isolation, NothingGrantedNothingToChangeLeavesTheSpecAlone) {
  Json spec = Json::parse(R"({"process": {"env": ["A=1"]}, "linux": {"resources": {"devices": [
      {"allow": false, "access": "rwm"}]}}})");
  Json before = spec;
  IsolationPlan plan;
  auto r = isolate_spec(spec, plan);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->changed);
  EXPECT_EQ(spec, before);
  Json bare = Json::parse(R"({"process": {"args": ["sh"]}})");
  Json bare_before = bare;
  ASSERT_TRUE(isolate_spec(bare, plan));
  EXPECT_EQ(bare, bare_before) << "no linux/resources/devices sections are invented";
}

TEST(Isolation, PrivilegedWithNoGpuLosesEveryGpuAndItsControlNodes) {
  Json spec = privileged_spec();
  IsolationPlan plan = grant_gpu1();
  plan.grant.clear();
  plan.uuids.clear();
  auto r = isolate_spec(spec, plan);
  ASSERT_TRUE(r);
  EXPECT_EQ(get_env(spec, "NVIDIA_VISIBLE_DEVICES"), "void");
  EXPECT_FALSE(get_env(spec, "CUDA_VISIBLE_DEVICES").has_value());
  EXPECT_EQ(device_paths(spec), (std::vector<std::string>{"/dev/fuse", "/dev/sda"}));
  auto rules = rules_of(spec);
  for (unsigned minor : {0u, 1u, 2u, 254u, 255u}) EXPECT_FALSE(rules_allow_open(rules, 195, minor));
  EXPECT_FALSE(rules_allow_open(rules, 511, 0));
}

TEST(Isolation, GpuNodeMinor) {
  EXPECT_EQ(gpu_node_minor("/dev/nvidia0"), 0u);
  EXPECT_EQ(gpu_node_minor("/dev/nvidia12"), 12u);
  EXPECT_FALSE(gpu_node_minor("/dev/nvidiactl"));
  EXPECT_FALSE(gpu_node_minor("/dev/nvidia-uvm"));
  EXPECT_FALSE(gpu_node_minor("/dev/nvidia"));
}

// runc 1.1's systemd cgroup driver (libcontainer/cgroups/systemd/common.go,
// generateDeviceProperties), replayed on the rules gpufence emits: DevicePolicy=strict plus one
// DeviceAllow per allow rule; a list that is a blacklist cannot be expressed at all. No systemd
// runs on these machines, so its translation is what is tested. docs/device-cgroup.md
namespace {

struct SystemdDevices {
  bool blacklist = false;  // runc would fall back to a deny-all placeholder
  std::vector<std::pair<std::string, std::string>> allow;  // DeviceAllow (path, perms)
};

SystemdDevices runc_systemd_translation(const std::vector<DeviceRule>& rules,
                                        const ProcDevices& proc,
                                        const std::set<std::string>& existing_dev_paths) {
  SystemdDevices out;
  // The emulator: a wildcard "a *:*" rule resets the list to allow-all (blacklist) or deny-all.
  std::vector<DeviceRule> list;
  for (const auto& r : rules) {
    if (r.type == 'a' && !r.major && !r.minor && r.access == "rwm") {
      out.blacklist = r.allow;
      list.clear();
      continue;
    }
    list.push_back(r);
  }
  if (out.blacklist) return out;
  for (const auto& r : list) {
    if (!r.allow) continue;  // whitelist denies only remove entries
    std::string path;
    const auto& section = r.type == 'b' ? proc.block : proc.character;
    std::string prefix = r.type == 'b' ? "block-" : "char-";
    if (!r.major) {
      if (r.minor) continue;  // "*:n" is not supported by systemd
      path = prefix + "*";
    } else if (!r.minor) {
      auto it = std::find_if(section.begin(), section.end(),
                             [&](const RegisteredMajor& m) { return m.major == *r.major; });
      if (it == section.end()) continue;  // runc warns and skips it
      path = prefix + it->name;
    } else {
      path = cat(r.type == 'b' ? "/dev/block/" : "/dev/char/", *r.major, ":", *r.minor);
      if (!existing_dev_paths.contains(path)) continue;  // runc skips paths that do not exist
    }
    out.allow.emplace_back(path, r.access);
  }
  return out;
}

}  // namespace

TEST(SystemdDriver, PrivilegedSpecAsEmittedIsExpressibleAndGrantsExactlyTheGpu) {
  auto proc = parse_proc_devices(kProcDevices);
  ASSERT_TRUE(proc);
  Json original = privileged_spec();
  auto before = runc_systemd_translation(rules_of(original), *proc, {});
  EXPECT_TRUE(before.blacklist) << "containerd's privileged rules are what systemd cannot say";

  Json spec = privileged_spec();
  ASSERT_TRUE(isolate_spec(spec, grant_gpu1()));
  std::set<std::string> dev_char = {"/dev/char/195:0", "/dev/char/195:1", "/dev/char/195:255",
                                    "/dev/char/511:0"};
  auto sd = runc_systemd_translation(rules_of(spec), *proc, dev_char);
  ASSERT_FALSE(sd.blacklist);
  std::map<std::string, std::string> allow(sd.allow.begin(), sd.allow.end());
  EXPECT_EQ(allow["/dev/char/195:1"], "rwm");
  EXPECT_EQ(allow["/dev/char/195:255"], "rwm");
  EXPECT_FALSE(allow.contains("/dev/char/195:0"));
  EXPECT_FALSE(allow.contains("char-nvidia-frontend"));
  EXPECT_FALSE(allow.contains("char-drm"));
  EXPECT_FALSE(allow.contains("char-nvidia-caps"));
  EXPECT_EQ(allow["char-*"], "m");
  EXPECT_EQ(allow["char-misc"], "rwm");
  EXPECT_EQ(allow["block-sd"], "rwm");
  for (const auto& [path, perms] : sd.allow) {
    if (path.ends_with("*")) {
      EXPECT_EQ(perms, "m") << path;
    }
  }
}

// Inputs tests/fuzz/fuzz_oci_spec.cpp found (each file: one config byte, then config.json).
namespace {
Json fuzz_spec(const std::string& name) {
  std::string bytes =
      read_file(test::source_path("tests/fuzz/corpus/oci_spec/" + name)).value_or(" {}");
  return Json::parse(bytes.substr(1));
}
}  // namespace

// nlohmann's value() threw type_error out of the shim (std::terminate) on a mistyped field. The
// edit now refuses the spec, names the field and changes nothing.
TEST(Isolation, MistypedFieldsAreErrorsNamingTheFieldNotExceptions) {
  struct Case {
    const char* input;
    const char* field;
  } cases[] = {
      {"crash-device-path-not-string-found", "linux.devices[4].path must be a string"},
      {"crash-device-path-not-string", "linux.devices[1].path must be a string"},
      {"crash-rule-allow-not-boolean", "linux.resources.devices[0].allow must be a boolean"},
      {"crash-rule-access-not-string", "linux.resources.devices[0].access must be a string"},
  };
  for (const auto& c : cases) {
    Json spec = fuzz_spec(c.input);
    const Json before = spec;
    Result<IsolationResult> r = std::unexpected(Error{});
    ASSERT_NO_THROW(r = isolate_spec(spec, grant_gpu1())) << c.input;
    ASSERT_FALSE(r) << c.input;
    EXPECT_EQ(r.error().code, Errc::parse) << c.input;
    EXPECT_NE(r.error().message.find(c.field), std::string::npos) << r.error().message;
    EXPECT_EQ(spec, before) << c.input << ": refused before any edit";
  }
  Json mount = fuzz_spec("crash-mount-destination-not-string");
  Result<AllocationChannels> ch = std::unexpected(Error{});
  ASSERT_NO_THROW(ch = read_allocation_channels(mount, RuntimeConfig{}, false));
  ASSERT_FALSE(ch);
  EXPECT_NE(ch.error().message.find(".destination must be a string"), std::string::npos)
      << ch.error().message;
}

// runc 1.1 takes any "a" rule as allow-all or deny-all whatever its numbers and access
// (docs/device-cgroup.md), so "allow a 1:3 m" after a deny-all opens every GPU: such a spec is
// rewritten as a whitelist like a privileged one.
TEST(Isolation, AnARuleWithNumbersIsAllowAllAsRuncTakesIt) {
  Json found = fuzz_spec("oracle-a-rule-with-numbers-found");
  auto refused = isolate_spec(found, grant_gpu1());
  ASSERT_FALSE(refused) << "its access 'rw 666…' is no access string; runc refuses it too";
  EXPECT_NE(refused.error().message.find("is not a subset of rwm"), std::string::npos);
  for (const char* name : {"oracle-a-rule-with-numbers"}) {
    Json spec = fuzz_spec(name);
    auto r = isolate_spec(spec, grant_gpu1());
    ASSERT_TRUE(r) << name << ": " << r.error().message;
    EXPECT_TRUE(r->whitelisted) << name;
    auto rules = rules_of(spec);
    for (unsigned minor : {0u, 2u, 7u}) EXPECT_FALSE(rules_allow_open(rules, 195, minor)) << name;
    EXPECT_TRUE(rules_allow_open(rules, 195, 1)) << name;
  }
  auto a = parse_device_rule(
      Json::parse(R"({"allow": true, "type": "a", "major": 1, "minor": 3, "access": "m"})"), "r");
  ASSERT_TRUE(a);
  EXPECT_EQ(describe_device_rule(*a), "allow a *:* rwm");
}
