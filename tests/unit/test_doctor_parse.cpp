// The doctor's parsers on literal /proc, /sys and config text, malformed included.
#include <gtest/gtest.h>

#include "common/base64.hpp"
#include "common/file.hpp"
#include "deviceplugin/api.hpp"
#include "doctor/gather.hpp"
#include "doctor/parse.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {
const std::string kId = "4b2f6f3c8d1e2a7b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b";
}

TEST(DoctorParse, ContainerIdInEveryCgroupForm) {
  EXPECT_EQ(container_id_from_cgroup("12:pids:/kubepods/besteffort/pod1234/" + kId +
                                     "\n5:devices:/kubepods/besteffort/pod1234/" + kId + "\n"),
            kId);
  EXPECT_EQ(container_id_from_cgroup("5:devices:/kubepods.slice/kubepods-burstable.slice/"
                                     "kubepods-burstable-podab_cd.slice/cri-containerd-" +
                                     kId + ".scope\n"),
            kId);
  EXPECT_EQ(container_id_from_cgroup("0::/kubepods.slice/kubepods-besteffort.slice/"
                                     "kubepods-besteffort-pod1.slice/cri-containerd-" +
                                     kId + ".scope\n"),
            kId);
  EXPECT_EQ(container_id_from_cgroup("0::/default/" + kId + "\n"), kId);
  EXPECT_EQ(container_id_from_cgroup("0::/system.slice/containerd.service\n"), std::nullopt);
  EXPECT_EQ(container_id_from_cgroup("0::/\n"), std::nullopt);
  EXPECT_EQ(container_id_from_cgroup("garbage\n\n::\n:x\n"), std::nullopt);
  EXPECT_EQ(container_id_from_cgroup(""), std::nullopt);
  EXPECT_EQ(container_id_from_cgroup("0::/kubepods/" + kId.substr(0, 63) + "\n"), std::nullopt)
      << "63 hex is not an id";
}

TEST(DoctorParse, CgroupPathPerController) {
  std::string v1 = "12:pids:/a\n5:devices:/kubepods/x\n3:cpu,cpuacct:/c\n";
  EXPECT_EQ(cgroup_path(v1, "devices"), "/kubepods/x");
  EXPECT_EQ(cgroup_path(v1, "cpuacct"), "/c");
  EXPECT_EQ(cgroup_path(v1, "memory"), std::nullopt);
  EXPECT_EQ(cgroup_path("0::/kubepods.slice/x.scope\n", ""), "/kubepods.slice/x.scope");
  EXPECT_EQ(cgroup_path("nonsense", "devices"), std::nullopt);
}

TEST(DoctorParse, EnvironIncludingTruncated) {
  auto env = parse_environ(std::string(
      "PATH=/bin\0NVIDIA_VISIBLE_DEVICES=GPU-1\0=bad\0NOEQ\0CUDA_VISIBLE_DEVICES=GPU-", 74));
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "GPU-1");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-") << "a truncated last entry keeps what it has";
  EXPECT_FALSE(env.contains("NOEQ"));
  EXPECT_TRUE(parse_environ("").empty());
}

TEST(DoctorParse, BoundingCaps) {
  auto caps = bounding_caps("Name:\tsleep\nCapBnd:\t000001ffffffffff\nCapAmb:\t0\n");
  ASSERT_TRUE(caps);
  EXPECT_TRUE((*caps >> kCapSysAdmin) & 1);
  EXPECT_FALSE((bounding_caps("CapBnd:\t00000000a80425fb\n").value() >> kCapSysAdmin) & 1);
  EXPECT_FALSE(bounding_caps("CapBnd:\tzz\n"));
  EXPECT_FALSE(bounding_caps("Name: x\n"));
}

TEST(DoctorParse, DevicesList) {
  std::set<unsigned> gpus = {0, 1};
  EXPECT_EQ(openable_gpu_minors_from_devices_list("a *:* rwm\n", gpus), std::nullopt)
      << "allow-all: only a probe can tell";
  EXPECT_EQ(openable_gpu_minors_from_devices_list("c 1:3 rwm\nc 195:1 rw\nc 195:255 rw\n", gpus),
            (std::set<unsigned>{1}));
  EXPECT_EQ(openable_gpu_minors_from_devices_list("c 195:* rw\n", gpus), gpus);
  EXPECT_EQ(openable_gpu_minors_from_devices_list("c *:* m\nc 195:0 m\n", gpus),
            (std::set<unsigned>{}))
      << "mknod only";
  EXPECT_EQ(openable_gpu_minors_from_devices_list("junk\nc 195\nc x:y rw\n", gpus),
            (std::set<unsigned>{}));
}

TEST(DoctorParse, OciRulesReplayedAsRuncDoes) {
  std::set<unsigned> gpus = {0, 1, 2};
  EXPECT_EQ(
      openable_gpu_minors_from_oci_rules(
          R"({"linux":{"resources":{"devices":[{"allow":true,"access":"rwm"},{"allow":false,"type":"c","major":195,"minor":0,"access":"rwm"}]}}})",
          gpus),
      (std::set<unsigned>{1, 2}));
  EXPECT_EQ(
      openable_gpu_minors_from_oci_rules(
          R"({"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":2,"access":"rw"}]}}})",
          gpus),
      (std::set<unsigned>{2}));
  EXPECT_TRUE(openable_gpu_minors_from_oci_rules("{not json", gpus).empty());
  EXPECT_TRUE(openable_gpu_minors_from_oci_rules(R"({"linux":{}})", gpus).empty());
}

TEST(DoctorParse, DeepStreamGpuIds) {
  auto keys = deepstream_gpu_ids(
      "[application]\nenable-perf-measurement=1\n\n[source0]\ngpu-id=0\n[primary-gie]\n  gpu-id = "
      "1 # second\n#gpu-id=7\n[sink0]\ngpu-id=x\n");
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].section, "source0");
  EXPECT_EQ(keys[0].gpu_id, 0);
  EXPECT_EQ(keys[1].section, "primary-gie");
  EXPECT_EQ(keys[1].gpu_id, 1);
  EXPECT_EQ(keys[1].line, 7);
  EXPECT_TRUE(deepstream_gpu_ids("[").empty());
}

// Found by tests/fuzz/fuzz_doctor_parse.cpp: nlohmann's value() threw out of the doctor on a rule
// whose allow or access has the wrong type. Such a rule (runc refuses the spec) is skipped.
TEST(DoctorParse, OciRulesWithMistypedFieldsAreSkippedNotThrown) {
  std::set<unsigned> gpus = {0, 1};
  for (const char* name : {"crash-rule-allow-not-boolean-found", "crash-rule-access-not-string"}) {
    auto text = read_file(test::source_path("tests/fuzz/corpus/doctor_parse/") + name).value();
    std::set<unsigned> open;
    ASSERT_NO_THROW(open = openable_gpu_minors_from_oci_rules(text, gpus)) << name;
    EXPECT_TRUE(open.empty()) << name;
  }
  // A list with a mistyped rule is one runc refuses to start: nothing is openable by it.
  EXPECT_EQ(
      openable_gpu_minors_from_oci_rules(
          R"({"linux":{"resources":{"devices":[{"allow":true,"access":"rwm"},{"allow":1,"type":"c","major":195,"minor":0}]}}})",
          gpus),
      (std::set<unsigned>{}));
}

// runc 1.1 takes any "a" rule as allow-all or deny-all whatever its numbers and access (measured
// with runc 1.1.5, docs/fuzzing.md); the replay counted "deny a m" as denying nothing and
// "allow a 1:3 m" as allowing nothing. Found by tests/fuzz/fuzz_oci_spec.cpp's oracle.
TEST(DoctorParse, AnyARuleResetsTheListAsRuncDoes) {
  std::set<unsigned> gpus = {0, 1};
  EXPECT_TRUE(
      openable_gpu_minors_from_oci_rules(
          R"({"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"access":"rw"},{"allow":false,"access":"m"}]}}})",
          gpus)
          .empty());
  EXPECT_EQ(
      openable_gpu_minors_from_oci_rules(
          R"({"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"a","major":1,"minor":3,"access":"m"}]}}})",
          gpus),
      gpus);
  EXPECT_EQ(
      openable_gpu_minors_from_oci_rules(
          R"({"linux":{"resources":{"devices":[{"allow":true,"access":"rwm"},{"allow":false,"major":195,"minor":0}]}}})",
          gpus),
      (std::set<unsigned>{}));
}

TEST(DoctorParse, CapabilitySetsByName) {
  std::string status =
      "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t00000000a80c25fb\n"
      "CapBnd:\t000001ffffffffff\nCapEffX:\t1\n";
  EXPECT_EQ(status_caps(status, "CapEff"), 0xa80c25fbULL);
  EXPECT_EQ(status_caps(status, "CapBnd"), 0x1ffffffffffULL);
  EXPECT_EQ(status_caps(status, "CapPrm"), std::nullopt);
  EXPECT_EQ(status_caps("CapEff:\tzz\n", "CapEff"), std::nullopt);
  EXPECT_EQ(status_caps("CapEffX:\t1\n", "CapEff"), std::nullopt) << "a longer name is not it";
}

TEST(DoctorParse, WritableSysfsMounts) {
  std::string mi =
      "500 400 0:21 / /sys ro,nosuid - sysfs sysfs rw\n"
      "601 500 0:21 /bus/pci /host/pci rw,relatime shared:7 master:1 - sysfs sysfs rw\n"
      "602 500 0:21 / /host/sys rw - sysfs sysfs rw\n"
      "603 500 0:30 / /fake rw - tmpfs sysfs rw\n"  // a tmpfs whose source says sysfs
      "604 500 0:21 / /a\\040b\\012-\\040sysfs rw - sysfs sysfs rw\n"  // the kernel's escapes
      "garbage\n- sysfs\n605 500 0:21 / /short rw -\n";
  EXPECT_EQ(writable_sysfs_mounts(mi),
            (std::vector<std::string>{"/host/pci (sysfs /bus/pci)", "/host/sys (sysfs /)",
                                      "/a\\040b\\012-\\040sysfs (sysfs /)"}));
  EXPECT_TRUE(writable_sysfs_mounts("").empty());
}

TEST(DoctorParse, KubeletCheckpointEntries) {
  v1beta1::ContainerAllocateResponse answer;
  for (std::string path : {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}) {
    auto* d = answer.add_devices();
    d->set_host_path(path);
    d->set_container_path(path);
  }
  std::string bytes;
  answer.SerializeToString(&bytes);
  std::string text = R"({"Data":{"PodDeviceEntries":[
      {"PodUID":"uid-a","ContainerName":"app","ResourceName":"nvidia.com/gpu",
       "DeviceIDs":{"0":["GPU-aaa"]},"AllocResp":")" +
                     base64_encode(bytes) + R"("},
      {"PodUID":"uid-b","ContainerName":"app","ResourceName":"example.com/nic",
       "DeviceIDs":{"-1":["nic0"]},"AllocResp":""}],
      "RegisteredDevices":{"nvidia.com/gpu":["GPU-aaa"]}},"Checksum":1})";
  auto entries = parse_kubelet_checkpoint(text, "nvidia.com/gpu");
  ASSERT_TRUE(entries) << entries.error().message;
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].pod_uid, "uid-a");
  EXPECT_EQ((*entries)[0].container, "app");
  EXPECT_EQ((*entries)[0].device_ids, (std::vector<std::string>{"GPU-aaa"}));
  EXPECT_EQ((*entries)[0].device_minors, (std::vector<unsigned>{1}));
  EXPECT_TRUE(
      parse_kubelet_checkpoint(R"({"Data":{"PodDeviceEntries":null}})", "nvidia.com/gpu")->empty());
  EXPECT_FALSE(parse_kubelet_checkpoint("not json", "nvidia.com/gpu"));
  EXPECT_FALSE(parse_kubelet_checkpoint(R"({"Data":{"PodDeviceEntries":[{"ResourceName":
      "nvidia.com/gpu","AllocResp":"@@@@"}]}})",
                                        "nvidia.com/gpu"));
}

// PodResources' DRA claims: GPU CDI names give the container's GPUs, each once (the kubelet
// repeats a driver's earlier devices in each later one's list); other kinds are no GPU.
TEST(DoctorPodResources, DraClaimsGiveTheGpusOfTheirGpuCdiNames) {
  EXPECT_EQ(gpu_ids_of_cdi_names({"gpufence.io/gpu=GPU-a", "gpufence.io/gpu=GPU-a",
                                  "gpufence.io/gpu=GPU-b", "nvidia.com/gpu=1",
                                  "vendor.example.com/nic=eth0", "gpufence.io/gpu=", "no-kind"}),
            (std::vector<std::string>{"GPU-a", "GPU-b", "1"}));
  // Another driver's names are kept whole, for the doctor to resolve by a listed kind.
  EXPECT_EQ(other_cdi_names({"gpufence.io/gpu=GPU-a", "k8s.gpu.nvidia.com/claim=u-gpu-0",
                             "k8s.gpu.nvidia.com/claim=u-gpu-0", "vendor.example.com/nic=eth0",
                             "x.io/y=", "=z", "no-kind"}),
            (std::vector<std::string>{"k8s.gpu.nvidia.com/claim=u-gpu-0",
                                      "vendor.example.com/nic=eth0"}));
}
