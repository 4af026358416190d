// The test kubelet's translation of an Allocate answer into a CRI ContainerConfig, field by field
// as the kubelet does it (docs/containerd-lines.md), and the host-network sandbox it asks for.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "checkpoint.hpp"
#include "common/base64.hpp"
#include "cri_client.hpp"
#include "test_kubelet.hpp"

namespace gpufence::test {
namespace {

CriPod pod(bool privileged) {
  CriPod p;
  p.name = "ds-0";
  p.uid = "uid-0";
  p.image = "gpufence.test/app:1";
  p.command = {"/bin/sleep", "3600"};
  p.privileged = privileged;
  return p;
}

v1beta1::ContainerAllocateResponse allocation() {
  v1beta1::ContainerAllocateResponse a;
  (*a.mutable_envs())["CUDA_VISIBLE_DEVICES"] = "GPU-a";
  (*a.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = "/var/run/nvidia-container-devices";
  auto* m = a.add_mounts();
  m->set_container_path("/var/run/nvidia-container-devices/GPU-a");
  m->set_host_path("/dev/null");
  m->set_read_only(true);
  auto* rw = a.add_mounts();
  rw->set_container_path("/data");
  rw->set_host_path("/srv/data");
  rw->set_read_only(false);
  auto* d = a.add_devices();
  d->set_container_path("/dev/nvidia0");
  d->set_host_path("/node/dev/nvidia0");
  d->set_permissions("rw");
  (*a.mutable_annotations())["cdi.k8s.io/gpufence_GPU-a"] = "nvidia.com/gpu=GPU-a";
  a.add_cdi_devices()->set_name("nvidia.com/gpu=GPU-a");
  return a;
}

TEST(CriTranslation, EnvsFromTheAllocateAnswer) {
  auto c = container_config(pod(false), allocation());
  std::map<std::string, std::string> envs;
  for (const auto& kv : c.envs()) envs[kv.key()] = kv.value();
  EXPECT_EQ(envs.size(), 2u);
  EXPECT_EQ(envs["CUDA_VISIBLE_DEVICES"], "GPU-a");
  EXPECT_EQ(envs["NVIDIA_VISIBLE_DEVICES"], "/var/run/nvidia-container-devices");
}

TEST(CriTranslation, DevicePluginEnvFirstThenThePods) {
  // GenerateRunContainerOptions: GetResources' envs, then makeEnvironmentVariables': the pod's
  // value comes last, and the last one is what the process sees.
  auto p = pod(false);
  p.env = {{"NVIDIA_VISIBLE_DEVICES", "all"}};
  auto c = container_config(p, allocation());
  ASSERT_EQ(c.envs_size(), 3);
  EXPECT_EQ(c.envs(1).key(), "NVIDIA_VISIBLE_DEVICES");
  EXPECT_EQ(c.envs(1).value(), "/var/run/nvidia-container-devices");
  EXPECT_EQ(c.envs(2).key(), "NVIDIA_VISIBLE_DEVICES");
  EXPECT_EQ(c.envs(2).value(), "all");
}

TEST(CriTranslation, MountsKeepPathsAndReadOnly) {
  auto c = container_config(pod(false), allocation());
  ASSERT_EQ(c.mounts_size(), 2);
  EXPECT_EQ(c.mounts(0).container_path(), "/var/run/nvidia-container-devices/GPU-a");
  EXPECT_EQ(c.mounts(0).host_path(), "/dev/null");
  EXPECT_TRUE(c.mounts(0).readonly());
  EXPECT_EQ(c.mounts(1).host_path(), "/srv/data");
  EXPECT_FALSE(c.mounts(1).readonly());
  EXPECT_EQ(c.mounts(0).propagation(), runtime::v1::PROPAGATION_PRIVATE);
}

TEST(CriTranslation, DevicePluginMountsComeBeforeThePodsVolumes) {
  // GenerateRunContainerOptions appends makeMounts' list to the device manager's mounts.
  auto p = pod(false);
  p.volumes = {{"/srv/videos", "/videos", true}, {"/run/acct", "/run/acct", false}};
  auto c = container_config(p, allocation());
  ASSERT_EQ(c.mounts_size(), 4);
  EXPECT_EQ(c.mounts(0).container_path(), "/var/run/nvidia-container-devices/GPU-a");
  EXPECT_EQ(c.mounts(1).host_path(), "/srv/data");
  EXPECT_EQ(c.mounts(2).host_path(), "/srv/videos");
  EXPECT_EQ(c.mounts(2).container_path(), "/videos");
  EXPECT_TRUE(c.mounts(2).readonly());
  EXPECT_EQ(c.mounts(3).host_path(), "/run/acct");
  EXPECT_FALSE(c.mounts(3).readonly());
}

TEST(CriTranslation, DevicesKeepHostPathAndPermissions) {
  auto c = container_config(pod(false), allocation());
  ASSERT_EQ(c.devices_size(), 1);
  EXPECT_EQ(c.devices(0).container_path(), "/dev/nvidia0");
  EXPECT_EQ(c.devices(0).host_path(), "/node/dev/nvidia0");
  EXPECT_EQ(c.devices(0).permissions(), "rw");
}

TEST(CriTranslation, AnnotationsAndCdiDevices) {
  auto c = container_config(pod(false), allocation());
  EXPECT_EQ(c.annotations().at("cdi.k8s.io/gpufence_GPU-a"), "nvidia.com/gpu=GPU-a");
  ASSERT_EQ(c.cdi_devices_size(), 1);
  EXPECT_EQ(c.cdi_devices(0).name(), "nvidia.com/gpu=GPU-a");
}

TEST(CriTranslation, NothingAllocatedAddsNothing) {
  auto c = container_config(pod(false), v1beta1::ContainerAllocateResponse{});
  EXPECT_EQ(c.envs_size(), 0);
  EXPECT_EQ(c.mounts_size(), 0);
  EXPECT_EQ(c.devices_size(), 0);
  EXPECT_EQ(c.cdi_devices_size(), 0);
  EXPECT_FALSE(c.annotations().contains("cdi.k8s.io/gpufence_GPU-a"));
}

TEST(CriTranslation, PrivilegedAndImageAndLabels) {
  auto c = container_config(pod(true), allocation());
  EXPECT_TRUE(c.linux().security_context().privileged());
  EXPECT_EQ(c.image().image(), "gpufence.test/app:1");
  ASSERT_EQ(c.command_size(), 2);
  EXPECT_EQ(c.labels().at("io.kubernetes.pod.name"), "ds-0");
  EXPECT_EQ(c.labels().at("io.kubernetes.container.name"), "app");
  EXPECT_FALSE(container_config(pod(false), allocation()).linux().security_context().privileged());
}

TEST(CriSandbox, PodAnnotationsGoOnTheSandboxNotTheContainer) {
  // generatePodSandboxConfig passes every pod annotation; the container's annotations are the
  // kubelet's own and the device plugin's. containerd copies the pod's through pod_annotations.
  auto p = pod(false);
  p.annotations = {{"cdi.k8s.io/x", "nvidia.com/gpu=GPU-b"}};
  EXPECT_EQ(sandbox_config(p).annotations().at("cdi.k8s.io/x"), "nvidia.com/gpu=GPU-b");
  auto c = container_config(p, v1beta1::ContainerAllocateResponse{});
  EXPECT_FALSE(c.annotations().contains("cdi.k8s.io/x"));
}

TEST(CriSandbox, HostNetworkNoHostname) {
  auto s = sandbox_config(pod(true));
  EXPECT_EQ(s.hostname(), "");
  EXPECT_EQ(s.linux().security_context().namespace_options().network(), runtime::v1::NODE);
  EXPECT_EQ(s.linux().security_context().namespace_options().pid(), runtime::v1::CONTAINER);
  EXPECT_TRUE(s.linux().security_context().privileged());
  EXPECT_EQ(s.metadata().name(), "ds-0");
  EXPECT_EQ(s.metadata().uid(), "uid-0");
  EXPECT_EQ(s.metadata().namespace_(), "default");
}

TEST(DevicesToAllocate, PreferredIdsCountOnlyWhenFree) {
  // manager.go devicesToAllocate: allocateRemainingFrom(preferred.Intersection(available)).
  EXPECT_EQ(choose_devices({}, {"b", "c"}, {"a", "c"}, 1), (std::vector<std::string>{"c"}));
  // The plugin named one free device of two needed: the rest from the free ones.
  EXPECT_EQ(choose_devices({}, {"b", "c"}, {"a", "c"}, 2), (std::vector<std::string>{"c", "b"}));
  // It named none (or nothing at all): the free ones in order.
  EXPECT_EQ(choose_devices({}, {"b", "c"}, {"a"}, 1), (std::vector<std::string>{"b"}));
  EXPECT_EQ(choose_devices({}, {"b", "c"}, {}, 1), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(choose_devices({}, {"b"}, {"a", "b"}, 2).empty());
}

TEST(DevicesToAllocate, ReusableDevicesComeFirst) {
  // An init container's devices are reused by the app container after it (devicesToReuse).
  EXPECT_EQ(choose_devices({"a"}, {"b", "c"}, {"c"}, 1), (std::vector<std::string>{"a"}));
  EXPECT_EQ(choose_devices({"a"}, {"b", "c"}, {"c"}, 2), (std::vector<std::string>{"a", "c"}));
}

TEST(Checkpoint, RoundTripsTheAllocateAnswer) {
  auto path = std::filesystem::temp_directory_path() / ("gf-ckpt-" + std::to_string(getpid()));
  DeviceCheckpoint out(path);
  out.registered = {"GPU-a", "GPU-b"};
  out.insert({"uid-0", "app", "nvidia.com/gpu", {"GPU-a"}, allocation()});
  std::string error;
  ASSERT_TRUE(out.store(&error)) << error;
  DeviceCheckpoint in(path);
  ASSERT_TRUE(in.load(&error)) << error;
  const auto* e = in.find("uid-0", "app");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->ids, (std::vector<std::string>{"GPU-a"}));
  // Maps serialize in no fixed order: compare as messages.
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(e->response, allocation()));
  EXPECT_EQ(in.find("uid-0", "init"), nullptr);
  EXPECT_EQ(in.registered, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  // A changed byte: the kubelet refuses a checkpoint whose checksum does not match.
  {
    std::fstream f(path, std::ios::in | std::ios::out);
    std::string text((std::istreambuf_iterator<char>(f)), {});
    text.replace(text.find("uid-0"), 5, "uid-9");
    f.seekp(0);
    f << text;
  }
  DeviceCheckpoint tampered(path);
  EXPECT_FALSE(tampered.load(&error));
  EXPECT_NE(error.find("checksum"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Checkpoint, Base64AsGoEncodesBytes) {
  for (const std::string& s :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)})
    EXPECT_EQ(base64_decode(base64_encode(s)), s);
  EXPECT_EQ(base64_encode("ab"), "YWI=");
  EXPECT_FALSE(base64_decode("YW=I"));
  EXPECT_FALSE(base64_decode("YWI"));
}

}  // namespace
}  // namespace gpufence::test
