// The spec edit, on literal config.json fragments.
#include <gtest/gtest.h>

#include "common/file.hpp"
#include "runtime/allocation.hpp"
#include "runtime/isolation.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

IsolationPlan grant_gpu1() {
  IsolationPlan plan;
  plan.grant = {{"/dev/nvidia1", 195, 1}, {"/dev/nvidiactl", 195, 255}};
  plan.deny_minors = {0, 2};
  plan.uuids = {"GPU-bbb"};
  return plan;
}

Json privileged_spec() {
  return Json::parse(R"({
    "ociVersion": "1.0.2-dev",
    "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
                "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}},
    "root": {"path": "rootfs"},
    "hostname": "x",
    "linux": {
      "devices": [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}
      ],
      "resources": {"devices": [{"allow": true, "access": "rwm"}]},
      "namespaces": [{"type": "pid"}]
    }
  })");
}

}  // namespace

TEST(Isolation, PrivilegedSpecKeepsOnlyTheGrantedGpuAndDeniesTheRest) {
  Json spec = privileged_spec();
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->changed);
  EXPECT_EQ(r->removed_nodes, (std::vector<std::string>{"/dev/nvidia0"}));
  EXPECT_EQ(r->denied_minors, (std::vector<unsigned>{0, 2}));
  std::vector<std::string> paths;
  for (const auto& d : spec["linux"]["devices"]) paths.push_back(d["path"]);
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/fuse", "/dev/nvidia1", "/dev/nvidiactl"}));
  const Json& rules = spec["linux"]["resources"]["devices"];
  ASSERT_EQ(rules.size(), 5u);
  EXPECT_EQ(rules[0], Json::parse(R"({"allow": true, "access": "rwm"})"));
  EXPECT_EQ(
      rules[3],
      Json::parse(R"({"allow": false, "type": "c", "major": 195, "minor": 0, "access": "rwm"})"));
  EXPECT_EQ(rules[4]["minor"], 2);
  EXPECT_EQ(get_env(spec, "NVIDIA_VISIBLE_DEVICES"), "GPU-bbb");
  EXPECT_EQ(get_env(spec, "CUDA_VISIBLE_DEVICES"), "GPU-bbb");
  // Untouched fields stay, in order.
  std::vector<std::string> keys;
  for (const auto& [k, v] : spec.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"ociVersion", "process", "root", "hostname", "linux"}));
  EXPECT_EQ(spec["linux"]["namespaces"][0]["type"], "pid");
}

TEST(Isolation, DefaultDenySpecLosesAllowsForUnallocatedGpusInsteadOfGainingDenies) {
  Json spec = Json::parse(R"({
    "process": {"env": []},
    "linux": {"resources": {"devices": [
      {"allow": false, "access": "rwm"},
      {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"},
      {"allow": true, "type": "c", "major": 195, "access": "rw"},
      {"allow": true, "type": "c", "access": "m"},
      {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
    ]}}
  })");
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->removed_rules, 2u);
  EXPECT_TRUE(r->denied_minors.empty());
  const Json& rules = spec["linux"]["resources"]["devices"];
  for (const auto& rule : rules)
    EXPECT_TRUE(rule["allow"] == false || rule.value("minor", -1) != 0) << rule.dump();
  EXPECT_EQ(rules.size(), 5u);  // deny-all, c *:* m, 1:3, allow 195:1, allow 195:255
  EXPECT_EQ(
      rules[3],
      Json::parse(R"({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"})"));
}

TEST(Isolation, WildcardReadWriteAllowInDefaultDenySpecIsRefused) {
  Json spec = Json::parse(R"({"linux": {"resources": {"devices": [
      {"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "access": "rwm"}]}}})");
  auto r = isolate_spec(spec, grant_gpu1());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::denied);
  EXPECT_NE(r.error().message.find("allow c *:* rwm"), std::string::npos) << r.error().message;
}

TEST(Isolation, NothingGrantedNothingToChangeLeavesTheSpecAlone) {
  Json spec = Json::parse(R"({"process": {"env": ["A=1"]}, "linux": {"resources": {"devices": [
      {"allow": false, "access": "rwm"}]}}})");
  Json before = spec;
  IsolationPlan plan;
  plan.deny_minors = {0, 1};
  auto r = isolate_spec(spec, plan);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->changed);
  EXPECT_EQ(spec, before);
  Json bare = Json::parse(R"({"process": {"args": ["sh"]}})");
  Json bare_before = bare;
  ASSERT_TRUE(isolate_spec(bare, plan));
  EXPECT_EQ(bare, bare_before) << "no linux/resources/devices sections are invented";
}

TEST(Isolation, NoGpuGrantedRewritesAllToVoid) {
  Json spec = privileged_spec();
  IsolationPlan plan;
  plan.deny_minors = {0, 1};
  auto r = isolate_spec(spec, plan);
  ASSERT_TRUE(r);
  EXPECT_EQ(get_env(spec, "NVIDIA_VISIBLE_DEVICES"), "void");
  EXPECT_FALSE(get_env(spec, "CUDA_VISIBLE_DEVICES").has_value());
  EXPECT_EQ(r->denied_minors, (std::vector<unsigned>{0, 1}));
  for (const auto& d : spec["linux"]["devices"])
    EXPECT_FALSE(gpu_node_minor(d["path"].get<std::string>()));
}

TEST(Isolation, GpuNodeMinor) {
  EXPECT_EQ(gpu_node_minor("/dev/nvidia0"), 0u);
  EXPECT_EQ(gpu_node_minor("/dev/nvidia12"), 12u);
  EXPECT_FALSE(gpu_node_minor("/dev/nvidiactl"));
  EXPECT_FALSE(gpu_node_minor("/dev/nvidia-uvm"));
  EXPECT_FALSE(gpu_node_minor("/dev/nvidia"));
}

TEST(Allocation, ChannelsInOrderAndEnvTrust) {
  RuntimeConfig cfg;
  Json spec = Json::parse(R"({
    "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]},
    "annotations": {"cdi.k8s.io/gpufence": "nvidia.com/gpu=GPU-aaa,vendor.com/fpga=1", "other/x": "nvidia.com/gpu=1"},
    "mounts": [{"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/GPU-bbb"}]
  })");
  auto req = find_allocation_request(spec, cfg, false);
  ASSERT_TRUE(req);
  EXPECT_EQ(req->channel, Channel::cdi_annotations);
  ASSERT_EQ(req->tokens.size(), 1u);
  EXPECT_EQ(req->tokens[0].uuid, "GPU-aaa");

  spec.erase("annotations");
  req = find_allocation_request(spec, cfg, false);
  EXPECT_EQ(req->channel, Channel::mount_markers);
  EXPECT_EQ(req->tokens[0].uuid, "GPU-bbb");

  spec.erase("mounts");
  req = find_allocation_request(spec, cfg, false);
  EXPECT_EQ(req->channel, Channel::none) << "unprivileged env is not trusted";
  EXPECT_NE(req->ignored.find("unprivileged"), std::string::npos);
  req = find_allocation_request(spec, cfg, true);
  EXPECT_EQ(req->channel, Channel::envvar);
  EXPECT_EQ(req->tokens[0].index, 0u);

  Json all = Json::parse(R"({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}})");
  EXPECT_EQ(find_allocation_request(all, cfg, true)->channel, Channel::none)
      << "image 'all' is not an allocation";
  cfg.trusted_channels.push_back(TrustedChannel::envvar);
  EXPECT_EQ(find_allocation_request(all, cfg, false)->channel, Channel::envvar);
}

TEST(Allocation, MalformedIdsOnTrustedChannelsAreErrors) {
  RuntimeConfig cfg;
  Json bad_marker = Json::parse(
      R"({"mounts": [{"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/GPU-"}]})");
  auto r = find_allocation_request(bad_marker, cfg, false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("mount marker /var/run/nvidia-container-devices/GPU-"),
            std::string::npos);
  Json bad_ann = Json::parse(R"({"annotations": {"cdi.k8s.io/a": "nvidia.com/gpu=0:1"}})");
  r = find_allocation_request(bad_ann, cfg, false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("MIG is not supported yet"), std::string::npos);
  Json not_marker = Json::parse(
      R"({"mounts": [{"source": "/tmp/x", "destination": "/var/run/nvidia-container-devices/GPU-zzz"}]})");
  EXPECT_EQ(find_allocation_request(not_marker, cfg, false)->channel, Channel::none)
      << "only /dev/null sources are markers";
}

namespace {

// A committed fuzz input (tests/fuzz/corpus/oci_spec/): one runtime-config byte, then config.json.
Json fuzz_spec(const std::string& name) {
  std::string bytes = read_file(test::source_path("tests/fuzz/corpus/oci_spec/" + name)).value();
  return Json::parse(bytes.substr(1));
}

}  // namespace

// Found by tests/fuzz/fuzz_oci_spec.cpp: nlohmann's value() threw type_error out of the shim
// (std::terminate) on a mistyped field. Now the edit refuses the spec and names the field.
TEST(Isolation, MistypedDeviceFieldsAreErrorsNamingTheFieldNotExceptions) {
  struct Case {
    const char* input;
    const char* field;
  } cases[] = {
      {"crash-device-path-not-string-found", "linux.devices[4].path is not a string"},
      {"crash-device-path-not-string", "linux.devices[1].path is not a string"},
      {"crash-rule-allow-not-boolean", "linux.resources.devices[0].allow is not a boolean"},
      {"crash-rule-access-not-string", "linux.resources.devices[0].access is not a string"},
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
}

TEST(Allocation, MountWithMistypedDestinationIsNotAMarkerNorAnException) {
  Json spec = fuzz_spec("crash-mount-destination-not-string");
  Result<AllocationRequest> r = std::unexpected(Error{});
  ASSERT_NO_THROW(r = find_allocation_request(spec, RuntimeConfig{}, false));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->channel, Channel::none);
}

// Found by tests/fuzz/fuzz_oci_spec.cpp's oracle: runc 1.1 takes any "a" rule (type "a", empty or
// absent) as allow-all or deny-all whatever its numbers and access (measured, docs/fuzzing.md),
// so "allow a 1:3 m" after a deny-all opens every GPU. The edit took it for a narrow rule, kept
// the spec "default-deny" and added no denies.
TEST(Isolation, AnARuleWithNumbersIsAllowAllAsRuncTakesIt) {
  for (const char* name : {"oracle-a-rule-with-numbers", "oracle-a-rule-with-numbers-found"}) {
    Json spec = fuzz_spec(name);
    auto r = isolate_spec(spec, grant_gpu1());
    ASSERT_TRUE(r) << name << ": " << r.error().message;
    EXPECT_EQ(r->denied_minors, (std::vector<unsigned>{0, 2})) << name;
    const Json& rules = spec["linux"]["resources"]["devices"];
    EXPECT_EQ(rules.back(), Json::parse(R"({"allow": false, "type": "c", "major": 195,
                                            "minor": 2, "access": "rwm"})"))
        << name << ": the denies come last";
  }
}
