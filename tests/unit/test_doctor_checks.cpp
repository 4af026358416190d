// Every doctor check on a fake node tree, with a test PodResources server standing in for the
// kubelet: one case that fires it, one that does not.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/strings.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/report.hpp"
#include "pod_resources_server.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

std::string env(std::initializer_list<std::string> vars) {
  std::string out;
  for (const auto& v : vars) out += v + std::string(1, '\0');
  return out;
}

class DoctorChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    m_node = std::make_unique<test::FakeNode>(m_dir.path());
    m_inv.list = test::fake_gpus(2);
    // A containerd config with a correct handler, so containerd findings stay out of the way.
    m_node->install_gpufence_handler();
  }
  std::string uuid(unsigned i) { return m_inv.list[i].uuid; }
  void kubelet(std::vector<test::PodAllocation> allocations,
               std::vector<std::string> allocatable = {}) {
    if (allocatable.empty()) allocatable = {uuid(0), uuid(1)};
    m_server = std::make_unique<test::PodResourcesServer>(
        (m_dir / "var/lib/kubelet/pod-resources/kubelet.sock").string(), "nvidia.com/gpu",
        allocations, allocatable);
    ASSERT_TRUE(m_server->start());
  }
  Snapshot snapshot(GatherOptions opt = {}) {
    return gather_snapshot(HostFs(m_dir.path()), opt, {.inventory = m_inv});
  }
  std::vector<std::string> ids(const std::vector<Finding>& f) {
    std::vector<std::string> out;
    for (const auto& x : f) out.push_back(x.id);
    return out;
  }
  std::vector<std::string> run(GatherOptions opt = {}) { return ids(judge(snapshot(opt))); }
  bool fired(const std::string& id, GatherOptions opt = {}) {
    auto all = run(opt);
    return std::find(all.begin(), all.end(), id) != all.end();
  }

  test::TempDir m_dir;
  std::unique_ptr<test::FakeNode> m_node;
  test::FakeInventory m_inv;
  std::unique_ptr<test::PodResourcesServer> m_server;
};

// A container allocated GPU 0 that holds exactly GPU 0.
test::FakeContainer good(const std::string& pod, unsigned pid, unsigned minor,
                         const std::string& uuid) {
  test::FakeContainer c;
  c.pod = pod;
  c.pids = {pid};
  c.env = env({"NVIDIA_VISIBLE_DEVICES=" + uuid, "CUDA_VISIBLE_DEVICES=" + uuid});
  c.dev_minors = {minor};
  c.devices_list = "c 195:" + std::to_string(minor) + " rw\nc 195:255 rw\n";
  return c;
}

}  // namespace

TEST_F(DoctorChecks, CleanNodeIsClean) {
  m_node->add(good("a", 100, 0, uuid(0)));
  m_node->add(good("b", 200, 1, uuid(1)));
  m_inv.procs[uuid(0)] = {{100, 1}};
  m_inv.procs[uuid(1)] = {{200, 1}};
  kubelet({{"default", "a", "main", {uuid(0)}}, {"default", "b", "main", {uuid(1)}}});
  auto snap = snapshot();
  auto findings = judge(snap);
  EXPECT_TRUE(findings.empty()) << render_doctor_text(snap, findings);
  EXPECT_EQ(snap.containers.size(), 2u);
  EXPECT_EQ(doctor_exit_code(findings), 0);
}

TEST_F(DoctorChecks, AContainerTheKubeletDoesNotNameIsNotJudgedAndSaysSo) {
  m_node->add(good("a", 100, 0, uuid(0)));
  auto other = good("by-hand", 200, 1, uuid(1));
  other.devices_list = "c 195:* rw\n";  // could open both GPUs
  m_node->add(other);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  auto snap = snapshot();
  EXPECT_TRUE(judge(snap).empty()) << render_doctor_text(snap, judge(snap));
  auto skipped = join(snap.skipped, "\n");
  EXPECT_NE(skipped.find("1 container(s) the kubelet's PodResources does not name"),
            std::string::npos)
      << skipped;
  EXPECT_NE(skipped.find("default/by-hand/main"), std::string::npos) << skipped;
  // Once the kubelet names it (with no devices), it is judged: it can open GPUs it was not given.
  m_server.reset();
  kubelet({{"default", "a", "main", {uuid(0)}}, {"default", "by-hand", "main", {}}});
  EXPECT_EQ(run(), (std::vector<std::string>{"gpu.no-request-can-open"}));
}

TEST_F(DoctorChecks, PodSandboxesAreNotContainersToJudge) {
  m_node->add(good("a", 100, 0, uuid(0)));
  auto sandbox = good("a", 101, 0, uuid(0));
  sandbox.name = "";
  sandbox.type = "sandbox";
  sandbox.env = env({});
  sandbox.devices_list = "c 195:0 rw\nc 195:1 rw\n";  // a privileged pod's pause, plain runc
  m_node->add(sandbox);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u) << render_doctor_text(snap, judge(snap));
  EXPECT_EQ(snap.containers[0].name, "main");
  EXPECT_TRUE(judge(snap).empty()) << render_doctor_text(snap, judge(snap));
}

TEST_F(DoctorChecks, OpenUnallocated) {
  auto c = good("a", 100, 0, uuid(0));
  c.devices_list = "c 195:* rw\n";
  m_node->add(c);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  EXPECT_EQ(run(), (std::vector<std::string>{"gpu.open-unallocated"}));
}

TEST_F(DoctorChecks, PrivilegedAllowAllReadFromTheOciRules) {
  auto c = good("a", 100, 0, uuid(0));
  c.has_cap_sys_admin = true;
  c.devices_list = "a *:* rwm\n";  // v1 shows only this once allow-all came first
  c.oci_rules = R"([{"allow":true,"access":"rwm"}])";
  m_node->add(c);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  // Privileged: every capability in its bounding set, CAP_SYS_PTRACE too (a warning of its own).
  EXPECT_EQ(run(),
            (std::vector<std::string>{"gpu.privileged-open-unallocated", "pod.cap-sys-ptrace"}));
  // With gpufence-runtime's deny rule after the allow-all, it is clean.
  auto c2 = c;
  c2.pod = "b";
  c2.pids = {300};
  c2.oci_rules =
      R"([{"allow":true,"access":"rwm"},{"allow":false,"type":"c","major":195,"minor":1,"access":"rwm"}])";
  m_node->add(c2);
  m_server.reset();
  kubelet({{"default", "a", "main", {uuid(0)}}, {"default", "b", "main", {uuid(0)}}});
  auto snap = snapshot();
  auto b = std::find_if(snap.containers.begin(), snap.containers.end(),
                        [](const NodeContainer& x) { return x.pod == "b"; });
  ASSERT_NE(b, snap.containers.end());
  EXPECT_EQ(b->openable, (std::set<unsigned>{0}));
  EXPECT_EQ(b->openable_source, "oci-spec rules");
}

TEST_F(DoctorChecks, NoRequestCanOpen) {
  test::FakeContainer c;
  c.pod = "cuda-image";
  c.pids = {100};
  c.env = env({"NVIDIA_VISIBLE_DEVICES=all"});
  c.devices_list = "c 195:0 rw\nc 195:1 rw\n";
  m_node->add(c);
  kubelet({{"default", "cuda-image", "main", {}}});
  EXPECT_EQ(run(), (std::vector<std::string>{"gpu.no-request-can-open"}));
  m_server.reset();
  EXPECT_FALSE(fired("gpu.no-request-can-open", {}))
      << "without the kubelet's view, no allocation claims are made";
}

TEST_F(DoctorChecks, ProcessOnUnallocatedAndShared) {
  m_node->add(good("a", 100, 0, uuid(0)));
  auto b = good("b", 200, 1, uuid(1));
  b.env = env({"NVIDIA_VISIBLE_DEVICES=" + uuid(1)});  // no CUDA_VISIBLE_DEVICES: CUDA picks GPU 0
  b.devices_list = "c 195:1 rw\n";
  m_node->add(b);
  kubelet({{"default", "a", "main", {uuid(0)}}, {"default", "b", "main", {uuid(1)}}});
  m_inv.procs[uuid(0)] = {{100, 1}, {200, 1}};  // the seed: everything on GPU 0
  auto found = run();
  EXPECT_EQ(found, (std::vector<std::string>{"gpu.process-on-unallocated", "gpu.shared"}));
  m_inv.procs[uuid(0)] = {{100, 1}};
  m_inv.procs[uuid(1)] = {{200, 1}};
  EXPECT_TRUE(run().empty());
}

TEST_F(DoctorChecks, VisibleDevicesMismatch) {
  auto c = good("a", 100, 0, uuid(0));
  c.env = env({"NVIDIA_VISIBLE_DEVICES=" + uuid(1)});
  m_node->add(c);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  EXPECT_EQ(run(), (std::vector<std::string>{"env.visible-devices-mismatch"}));
  // The volume-mounts form defers to the markers: not a mismatch.
  test::TempDir d2;
  test::FakeNode n2(d2.path());
  auto c2 = good("a", 100, 0, uuid(0));
  c2.env = env({"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"});
  n2.add(c2);
  auto snap = gather_snapshot(HostFs(d2.path()), {}, {.inventory = m_inv});
  snap.allocations = std::vector<KubeletAllocation>{{"default", "a", "main", {uuid(0)}}};
  for (const auto& f : judge(snap)) EXPECT_NE(f.id, "env.visible-devices-mismatch");
}

// gpufence's CDI spec sets NVIDIA_VISIBLE_DEVICES=void in every GPU container (so a legacy hook
// adds nothing; the GPUs arrive as device nodes): under gpufence-nri that is what each one
// holds. "void" selects nothing, so it cannot disagree with the allocation; a value that names
// another GPU still does.
TEST_F(DoctorChecks, GpufencesOwnVoidIsNoMismatch) {
  auto c = good("a", 100, 0, uuid(0));
  c.env = env({"NVIDIA_VISIBLE_DEVICES=void", "CUDA_VISIBLE_DEVICES=" + uuid(0)});
  m_node->add(c);
  auto d = good("b", 200, 1, uuid(1));
  d.env = env({"NVIDIA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=" + uuid(1)});
  m_node->add(d);
  kubelet({{"default", "a", "main", {uuid(0)}}, {"default", "b", "main", {uuid(1)}}});
  auto findings = judge(snapshot());
  ASSERT_EQ(findings.size(), 1u) << findings_text(findings);
  EXPECT_EQ(findings[0].id, "env.visible-devices-mismatch");
  EXPECT_NE(findings[0].summary.find("default/b/main"), std::string::npos) << findings[0].summary;
}

TEST_F(DoctorChecks, NodeCapacityAndUnhealthyGpus) {
  m_node->add(good("a", 100, 0, uuid(0)));
  kubelet({{"default", "a", "main", {uuid(0)}}}, {uuid(0)});
  EXPECT_EQ(run(), (std::vector<std::string>{"node.gpu-not-allocatable"}));
  m_server.reset();
  m_server = std::make_unique<test::PodResourcesServer>(
      (m_dir / "var/lib/kubelet/pod-resources/kubelet.sock").string(), "nvidia.com/gpu",
      std::vector<test::PodAllocation>{}, std::vector<std::string>{});
  ASSERT_TRUE(m_server->start());
  auto findings = judge(snapshot());
  auto cap = std::find_if(findings.begin(), findings.end(),
                          [](const Finding& f) { return f.id == "node.gpu-capacity"; });
  ASSERT_NE(cap, findings.end());
  EXPECT_NE(cap->fix.find("Init:3/4"), std::string::npos);
}

TEST_F(DoctorChecks, DeepStreamGpuIdTheContainerCannotSee) {
  auto c = good("a", 100, 1, uuid(1));
  c.files["/opt/app/ds.txt"] = "[primary-gie]\ngpu-id=1\n";
  m_node->add(c);
  kubelet({{"default", "a", "main", {uuid(1)}}});
  GatherOptions opt;
  opt.app_configs = {"/opt/app/ds.txt"};
  EXPECT_EQ(run(opt), (std::vector<std::string>{"deepstream.gpu-id-invisible"}));
  m_node->write("proc/100/root/opt/app/ds.txt", "[primary-gie]\ngpu-id=0\n");
  EXPECT_TRUE(run(opt).empty());
}

// Attacks on the doctor through a container's own files (common/in_root.hpp): its links resolve
// inside its root, and what is not a regular file is not read.
TEST_F(DoctorChecks, AContainersLinksDoNotReachHostFiles) {
  // A host file the container's links aim at by absolute path; followed from the host, the
  // doctor would read it as the container's config, and list a directory of its as its /dev.
  test::TempDir host;
  std::filesystem::create_directories(host / "dev");
  {
    std::ofstream(host / "ds.txt") << "[primary-gie]\ngpu-id=1\n";
    std::ofstream(host / "dev/nvidia1") << "";
  }
  auto c = good("a", 100, 0, uuid(0));
  c.dev_minors = {};
  m_node->add(c);
  auto root = m_dir / "proc/100/root";
  std::filesystem::create_directories(root / "opt/app");
  std::filesystem::create_symlink(host / "ds.txt", root / "opt/app/ds.txt");
  std::filesystem::create_directory_symlink(host / "dev", root / "dev");
  kubelet({{"default", "a", "main", {uuid(0)}}});
  GatherOptions opt;
  opt.app_configs = {"/opt/app/ds.txt"};
  auto snap = snapshot(opt);
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_TRUE(snap.containers[0].app_gpu_ids.empty()) << "read the host's file through a link";
  EXPECT_TRUE(snap.containers[0].gpu_nodes_present.empty()) << "listed the host's directory";
  // The same link inside the root reaches the container's own file.
  std::filesystem::remove(root / "opt/app/ds.txt");
  m_node->write("proc/100/root" + host.path().string() + "/ds.txt", "[primary-gie]\ngpu-id=0\n");
  std::filesystem::create_symlink(host / "ds.txt", root / "opt/app/ds.txt");
  snap = snapshot(opt);
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_EQ(snap.containers[0].app_gpu_ids["/opt/app/ds.txt"], (std::vector<int>{0}));
}

TEST_F(DoctorChecks, AFifoWhereTheConfigWasExpectedIsNotWaitedOn) {
  auto c = good("a", 100, 0, uuid(0));
  m_node->add(c);
  auto root = m_dir / "proc/100/root";
  std::filesystem::create_directories(root / "opt/app");
  ASSERT_EQ(::mkfifo((root / "opt/app/ds.txt").c_str(), 0644), 0);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  GatherOptions opt;
  opt.app_configs = {"/opt/app/ds.txt"};
  // Opening a FIFO for reading blocks until a writer comes: run it aside, bounded.
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto snap = std::make_shared<Snapshot>();
  std::thread([this, opt, done, snap] {
    *snap = snapshot(opt);
    *done = true;
  }).detach();
  for (int i = 0; i < 100 && !*done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(*done) << "the doctor blocked on the container's FIFO";
  ASSERT_EQ(snap->containers.size(), 1u);
  EXPECT_TRUE(snap->containers[0].app_gpu_ids.empty());
}

TEST_F(DoctorChecks, ContainerdFindingsAreIncluded) {
  m_node->write("etc/containerd/config.toml", "version = 2\n");
  kubelet({});
  EXPECT_EQ(run(), (std::vector<std::string>{"containerd.handler-missing"}));
  GatherOptions opt;
  opt.handlers = {"gpu"};
  m_node->write(
      "etc/containerd/config.toml",
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = "
      "\"nvidia\"\n");
  auto found = run(opt);
  EXPECT_NE(std::find(found.begin(), found.end(), "containerd.default-runtime-undefined"),
            found.end());
}

TEST_F(DoctorChecks, EveryCgroupFormIsRecognised) {
  for (auto form :
       {test::FakeContainer::CgroupForm::systemd, test::FakeContainer::CgroupForm::v2}) {
    auto c = good(form == test::FakeContainer::CgroupForm::v2 ? "v2" : "sd",
                  form == test::FakeContainer::CgroupForm::v2 ? 400u : 300u, 0, uuid(0));
    c.form = form;
    m_node->add(c);
  }
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 2u);
  for (const auto& c : snap.containers) {
    EXPECT_FALSE(c.pod.empty());
    EXPECT_TRUE(c.openable.has_value());
  }
}

TEST_F(DoctorChecks, BrokenInputsNeverCrashAndSkippedLayersAreNamed) {
  m_node->write("proc/777/cgroup", "garbage\n:::\n0::\n");
  m_node->write("proc/778/cgroup", "5:devices:/kubepods/besteffort/podx/" + std::string(64, 'a') +
                                       "\n");  // vanished: no status, environ
  m_node->write("proc/779/environ", std::string("A=1\0B", 5));
  m_node->write("run/containerd/io.containerd.runtime.v2.task/k8s.io/" + std::string(64, 'a') +
                    "/config.json",
                "{truncated");
  m_node->write(
      "sys/fs/cgroup/devices/kubepods/besteffort/podx/" + std::string(64, 'a') + "/devices.list",
      "c 195");
  auto snap = gather_snapshot(HostFs(m_dir.path()), {},
                              {.inventory = fail(Errc::nvml, "cannot load NVML library x")});
  EXPECT_EQ(snap.containers.size(), 1u);
  auto text = render_doctor_text(snap, judge(snap));
  EXPECT_NE(text.find("NVML: cannot load NVML library x"), std::string::npos);
  EXPECT_NE(text.find("kubelet: no PodResources socket"), std::string::npos);
  auto json = render_doctor_json(snap, judge(snap));
  EXPECT_EQ(json["schema"], "gpufence.doctor/v1");
  EXPECT_EQ(json["skipped"].size(), 3u) << "NVML, kubelet, Kubernetes API";
  EXPECT_NE(text.find("Kubernetes API: not asked"), std::string::npos);
}

TEST_F(DoctorChecks, DeadKubeletSocketIsSkippedNotFatal) {
  m_node->write("var/lib/kubelet/pod-resources/kubelet.sock", "");  // a file, nobody listening
  auto snap = snapshot();
  EXPECT_FALSE(snap.allocations.has_value());
  bool named = false;
  for (const auto& s : snap.skipped) named |= s.find("PodResources List") != std::string::npos;
  EXPECT_TRUE(named);
}

// Without --probe the devices column is what the rules say, and says so.
TEST_F(DoctorChecks, WithoutTheProbeTheDevicesColumnSaysItIsUnverified) {
  m_node->add(good("a", 100, 0, uuid(0)));
  kubelet({{"default", "a", "main", {uuid(0)}}});
  auto snap = snapshot();
  auto findings = judge(snap);
  ASSERT_TRUE(findings.empty()) << render_doctor_text(snap, findings);
  auto text = render_doctor_text(snap, findings);
  EXPECT_NE(text.find("can open GPU0 (devices.list, unverified)"), std::string::npos) << text;
  EXPECT_NE(text.find("not observed"), std::string::npos) << text;
  EXPECT_EQ(text.find("reality"), std::string::npos) << "claims what it did not observe:\n" << text;
  auto json = render_doctor_json(snap, findings);
  ASSERT_EQ(json["containers"].size(), 1u);
  EXPECT_EQ(json["containers"][0]["openable_source"], "devices.list") << "kept as it was";
  EXPECT_EQ(json["containers"][0]["openable_verified"], false);
  // A probe result is observed: said as such.
  snap.containers[0].openable_source = "probe";
  text = render_doctor_text(snap, findings);
  EXPECT_NE(text.find("can open GPU0 (probe)"), std::string::npos) << text;
  EXPECT_EQ(text.find("unverified"), std::string::npos) << text;
  EXPECT_EQ(render_doctor_json(snap, findings)["containers"][0]["openable_verified"], true);
}

// A process that moved itself into the root devices cgroup (v1: its other controllers' lines still
// name the container). The doctor read the container's own rules and said it could open only its
// allocation.
TEST_F(DoctorChecks, AProcessThatLeftItsDevicesCgroupIsReported) {
  auto c = good("a", 100, 0, uuid(0));
  c.pids = {100, 101};
  std::string id = m_node->add(c);
  std::string own = "/kubepods/besteffort/poda/" + id;
  m_node->write("proc/101/cgroup",
                "12:pids:" + own + "\n5:devices:/\n1:name=systemd:" + own + "\n");
  m_node->write("sys/fs/cgroup/devices/devices.list", "a *:* rwm\n");
  kubelet({{"default", "a", "main", {uuid(0)}}});
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u);
  auto findings = judge(snap);
  ASSERT_EQ(ids(findings), (std::vector<std::string>{"gpu.left-devices-cgroup"}))
      << render_doctor_text(snap, findings);
  EXPECT_NE(findings[0].evidence.find("pid 101 in devices cgroup /"), std::string::npos)
      << findings[0].evidence;
  EXPECT_NE(render_doctor_text(snap, findings).find("[processes outside this cgroup]"),
            std::string::npos);
  EXPECT_EQ(render_doctor_json(snap, findings)["containers"][0]["left_devices_cgroup"].size(), 1u);
}

// A container the kubelet does not name (another test's, another kubelet's, made by hand) is
// Skipped, not judged, for this as for every check (found when such a container of a parallel
// scenario moved itself to the root devices cgroup and failed doctor.fixed).
TEST_F(DoctorChecks, AContainerOutsideTheKubeletsViewIsNotJudgedForLeavingItsCgroup) {
  auto c = good("a", 100, 0, uuid(0));
  c.pids = {100, 101};
  std::string id = m_node->add(c);
  std::string own = "/kubepods/besteffort/poda/" + id;
  m_node->write("proc/101/cgroup",
                "12:pids:" + own + "\n5:devices:/\n1:name=systemd:" + own + "\n");
  m_node->write("sys/fs/cgroup/devices/devices.list", "a *:* rwm\n");
  kubelet({{"default", "other", "main", {uuid(1)}}});
  auto snap = snapshot();
  EXPECT_EQ(ids(judge(snap)), std::vector<std::string>{});
}

// Every process left: neither the root cgroup's list nor the bundle's rules are the container's,
// so no "can open" is claimed from them (the old report: "can open GPU0 (oci-spec rules)").
TEST_F(DoctorChecks, AContainerWhoseProcessesAllLeftClaimsNoRules) {
  auto c = good("a", 100, 0, uuid(0));
  c.oci_rules =
      R"([{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":0,"access":"rw"}])";
  std::string id = m_node->add(c);
  std::string own = "/kubepods/besteffort/poda/" + id;
  m_node->write("proc/100/cgroup", "12:pids:" + own + "\n5:devices:/\n");
  m_node->write("sys/fs/cgroup/devices/devices.list", "a *:* rwm\n");
  kubelet({{"default", "a", "main", {uuid(0)}}});
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_FALSE(snap.containers[0].openable.has_value())
      << "claimed " << snap.containers[0].openable_source;
  EXPECT_EQ(ids(judge(snap)), (std::vector<std::string>{"gpu.left-devices-cgroup"}));
}

// cgroup v2: a process that moved to "0::/" names no container; its PID namespace is still the
// container's.
TEST_F(DoctorChecks, OnCgroupV2AProcessOfItsPidNamespaceElsewhereIsReported) {
  auto c = good("v2", 100, 0, uuid(0));
  c.form = test::FakeContainer::CgroupForm::v2;
  c.oci_rules =
      R"([{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":0,"access":"rw"}])";
  m_node->add(c);
  m_node->write("proc/102/cgroup", "0::/\n");
  std::filesystem::create_directories(m_dir / "proc/102/ns");
  std::filesystem::create_symlink(std::filesystem::read_symlink(m_dir / "proc/100/ns/pid"),
                                  m_dir / "proc/102/ns/pid");
  // A host process in no container, in the host's namespace: not the container's.
  m_node->write("proc/103/cgroup", "0::/system.slice/sshd.service\n");
  std::filesystem::create_directories(m_dir / "proc/103/ns");
  std::filesystem::create_symlink(test::kHostPidNs, m_dir / "proc/103/ns/pid");
  kubelet({{"default", "v2", "main", {uuid(0)}}});
  auto snap = snapshot();
  auto findings = judge(snap);
  ASSERT_EQ(ids(findings), (std::vector<std::string>{"gpu.left-devices-cgroup"}))
      << render_doctor_text(snap, findings);
  EXPECT_NE(findings[0].evidence.find("pid 102 of its PID namespace in cgroup /"),
            std::string::npos)
      << findings[0].evidence;
  EXPECT_EQ(findings[0].evidence.find("pid 103"), std::string::npos) << findings[0].evidence;
}

// The fix for a container that can open a GPU it was not given follows the node's setup: "run it
// through gpufence-runtime" was said to pods that already did.
TEST_F(DoctorChecks, TheFixTextMatchesTheRuntimeThePodRanThrough) {
  auto c = good("a", 100, 0, uuid(0));
  c.devices_list = "c 195:* rw\n";
  m_node->add(c);
  kubelet({{"default", "a", "main", {uuid(0)}}});
  auto fix_for = [&](std::optional<KubeView> kube) {
    auto snap = snapshot();
    snap.kube = std::move(kube);
    auto findings = judge(snap);
    auto f = std::find_if(findings.begin(), findings.end(),
                          [](const Finding& x) { return x.id == "gpu.open-unallocated"; });
    EXPECT_NE(f, findings.end()) << render_doctor_text(snap, findings);
    return f == findings.end() ? std::string() : f->fix;
  };
  KubeView through_gpufence;
  through_gpufence.runtime_classes = {{"nvidia", "nvidia"}};
  through_gpufence.pods = {{"default", "a", "nvidia", 1, false, {}}};
  auto fix = fix_for(through_gpufence);
  EXPECT_FALSE(fix.starts_with("run the pod through gpufence-runtime")) << fix;
  EXPECT_NE(fix.find("it ran through gpufence-runtime"), std::string::npos) << fix;
  EXPECT_NE(fix.find("RuntimeClass nvidia -> handler nvidia -> /usr/local/bin/gpufence-runtime"),
            std::string::npos)
      << fix;
  EXPECT_NE(fix.find("docs/trust-model.md"), std::string::npos) << fix;

  KubeView plain_runc = through_gpufence;
  plain_runc.pods = {{"default", "a", "", 1, false, {}}};  // containerd's default: runc
  fix = fix_for(plain_runc);
  EXPECT_TRUE(fix.starts_with("run the pod through gpufence-runtime")) << fix;
  EXPECT_NE(fix.find("handler runc -> runc"), std::string::npos) << fix;

  fix = fix_for(std::nullopt);  // no API view: the runtime is not known, both cases are named
  EXPECT_TRUE(fix.starts_with("if the pod does not run through gpufence-runtime")) << fix;
  EXPECT_NE(fix.find("if it does"), std::string::npos) << fix;
}

// Routes around the devices cgroup, judged from what /proc shows.
TEST_F(DoctorChecks, HostPidPtraceAndWritableSysfsOfGpuPodsAreReported) {
  auto hostpid = good("hostpid", 100, 0, uuid(0));
  hostpid.host_pid = true;
  m_node->add(hostpid);
  auto ptrace = good("ptrace", 200, 1, uuid(1));
  ptrace.cap_eff = "00000000a80c25fb";  // the default set plus CAP_SYS_PTRACE (19)
  ptrace.mountinfo =
      "500 400 0:21 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs rw\n"
      "601 500 0:21 /bus/pci /host/pci rw,relatime shared:7 - sysfs sysfs rw\n";
  m_node->add(ptrace);
  // Not GPU pods (the kubelet gave them nothing): node agents' business, not these checks'.
  auto agent = good("agent", 300, 0, uuid(0));
  agent.host_pid = true;
  agent.devices_list = "c 1:3 rwm\n";
  agent.dev_minors = {};
  m_node->add(agent);
  kubelet({{"default", "hostpid", "main", {uuid(0)}},
           {"default", "ptrace", "main", {uuid(1)}},
           {"default", "agent", "main", {}}});
  m_node->write("proc/sys/kernel/yama/ptrace_scope", "1\n");
  auto snap = snapshot();
  auto findings = judge(snap);
  std::map<std::string, const Finding*> by_id;
  for (const auto& f : findings) by_id[f.id] = &f;
  EXPECT_EQ(ids(findings),
            (std::vector<std::string>{"pod.host-pid", "pod.writable-sysfs", "pod.cap-sys-ptrace"}))
      << render_doctor_text(snap, findings);
  ASSERT_TRUE(by_id.contains("pod.host-pid"));
  EXPECT_NE(by_id["pod.host-pid"]->summary.find("default/hostpid/main"), std::string::npos);
  EXPECT_NE(by_id["pod.host-pid"]->evidence.find("ns/pid is PID 1's"), std::string::npos);
  EXPECT_NE(by_id["pod.host-pid"]->evidence.find("ptrace_scope 1"), std::string::npos);
  ASSERT_TRUE(by_id.contains("pod.cap-sys-ptrace"));
  EXPECT_EQ(by_id["pod.cap-sys-ptrace"]->severity, Severity::warning) << "no hostPID";
  EXPECT_NE(by_id["pod.cap-sys-ptrace"]->evidence.find("effective yes"), std::string::npos);
  ASSERT_TRUE(by_id.contains("pod.writable-sysfs"));
  EXPECT_NE(by_id["pod.writable-sysfs"]->evidence.find("/host/pci (sysfs /bus/pci)"),
            std::string::npos)
      << by_id["pod.writable-sysfs"]->evidence;
  EXPECT_EQ(by_id["pod.writable-sysfs"]->evidence.find("/sys (sysfs /)"), std::string::npos)
      << "its own read-only /sys is not writable";
  auto json = render_doctor_json(snap, findings);
  for (const auto& c : json["containers"]) {
    if (c["pod"] == "hostpid") {
      EXPECT_EQ(c["host_pid"], true);
    }
    if (c["pod"] == "ptrace") {
      EXPECT_EQ(c["host_pid"], false);
      EXPECT_EQ(c["cap_sys_ptrace"], true);
      EXPECT_EQ(c["writable_sysfs"].size(), 1u);
    }
  }
}

// ---- the enforcement `gpufence install` recorded, and containerd's NRI ----

namespace {

// A listening unix socket at `path` (containerd's NRI socket), closed with the object.
struct ListeningSocket {
  int fd = -1;
  explicit ListeningSocket(const std::filesystem::path& path) {
    std::filesystem::create_directories(path.parent_path());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string p = path.string();
    if (p.size() >= sizeof addr.sun_path) return;
    std::memcpy(addr.sun_path, p.data(), p.size());
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 1) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~ListeningSocket() {
    if (fd >= 0) ::close(fd);
  }
};

const char* kState = R"({"enforcement": "%s"})";

std::string state(const std::string& mode) {
  std::string s = kState;
  return s.replace(s.find("%s"), 2, mode);
}

// containerd 2.x with NRI on and gpufence-nri and its fence required (what install
// --enforcement nri writes on containerd >= 2.2).
const std::string kNriRequired =
    "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n"
    "  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n    enable = true\n"
    "    required_plugins = ['gpufence-nri', 'gpufence-fence']\n";

// The plugin_path links install makes (containerd's default plugin_path).
void link_nri_plugins(const std::filesystem::path& root) {
  std::filesystem::create_directories(root / "opt/nri/plugins");
  std::filesystem::create_directories(root / "usr/local/bin");
  std::ofstream(root / "usr/local/bin/gpufence-nri") << "#!/bin/sh\n";
  for (const char* name : {"10-gpufence-nri", "20-gpufence-fence"})
    std::filesystem::create_symlink("/usr/local/bin/gpufence-nri", root / "opt/nri/plugins" / name);
}

std::vector<Finding> nri_findings(const std::vector<Finding>& all) {
  std::vector<Finding> out;
  for (const auto& f : all)
    if (f.id.starts_with("nri.")) out.push_back(f);
  return out;
}

}  // namespace

namespace {

// gpufence-nri's status as the plugin writes it (nri/status.hpp), naming a process of the fake
// host's /proc whose start time is `proc_start` (the status says `start`).
void write_nri_status(const test::FakeNode& node, nri::NriState state, uint64_t start,
                      uint64_t proc_start, std::vector<nri::UnenforcedContainer> unenforced = {},
                      std::string synchronized_at = "2026-12-02T03:00:01Z", bool stale = false) {
  nri::NriStatus st;
  st.pid = 4242;
  st.start_time = start;
  st.state = state;
  st.since = "2026-12-02T03:00:00Z";
  st.socket = "/var/run/nri/nri.sock";
  st.synchronized_at = std::move(synchronized_at);
  st.judgement_stale = stale;
  st.unenforced = std::move(unenforced);
  node.write("var/lib/gpufence/nri-status.json", nri::render_nri_status(st));
  std::string stat = "4242 (gpufence-nri) S";
  for (int f = 4; f <= 52; ++f) stat += " " + std::to_string(f == 22 ? proc_start : 0);
  node.write("proc/4242/stat", stat + "\n");
}

}  // namespace

TEST_F(DoctorChecks, NriFindingsOnlyWhereInstallChoseNri) {
  // No record, or a runtime one: NRI is not gpufence's enforcement point, nothing to say.
  m_node->write("etc/containerd/config.toml", "version = 2\n");
  EXPECT_TRUE(nri_findings(judge(snapshot())).empty());
  m_node->write("etc/gpufence/install-state.json", state("runtime"));
  EXPECT_TRUE(nri_findings(judge(snapshot())).empty());
}

TEST_F(DoctorChecks, NriModeWithNriOffInTheConfigIsAnError) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  // containerd 1.7's config without the NRI table: off by default.
  m_node->write("etc/containerd/config.toml", "version = 2\n");
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].id, "nri.disabled");
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_EQ(f[1].id, "nri.not-fail-closed");
  EXPECT_NE(f[1].summary.find("NRI enforcement not guaranteed while gpufence-nri is down"),
            std::string::npos);
  EXPECT_EQ(f[1].severity, Severity::error) << "nri alone: nothing else enforces";
}

TEST_F(DoctorChecks, NriModeWithoutTheSocketIsAnError) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.socket-missing");
  EXPECT_NE(f[0].summary.find("/var/run/nri/nri.sock"), std::string::npos);
}

TEST_F(DoctorChecks, NriModeFailClosedWithTheSocketIsClean) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  ASSERT_GE(sock.fd, 0);
  auto snap = snapshot();
  ASSERT_TRUE(snap.nri);
  EXPECT_TRUE(snap.nri->socket_present);
  EXPECT_TRUE(nri_findings(judge(snap)).empty());
}

// The doctor in a pod (--host-root /host): the host's /var/run is an absolute link to /run, which
// must lead to the host's /run, not the pod's. Seen on the cluster tier: nri.socket-missing and
// containerd.handler-missing on a correctly installed node.
TEST_F(DoctorChecks, TheNriSocketIsFoundThroughTheHostsVarRunLink) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  std::filesystem::remove_all(m_dir / "var/run");
  std::filesystem::create_symlink("/run", m_dir / "var/run");
  ListeningSocket sock(m_dir / "run/nri/nri.sock");
  ASSERT_GE(sock.fd, 0);
  auto snap = snapshot();
  ASSERT_TRUE(snap.nri);
  EXPECT_TRUE(snap.nri->socket_present);
  EXPECT_TRUE(nri_findings(judge(snap)).empty());
}

// containerd < 2.2 (no required_plugins), paired with the shim: a warning naming both fixes.
TEST_F(DoctorChecks, BothBelowContainerd22WarnsWithTheFix) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("both"));
  m_node->write("etc/containerd/config.toml",
                "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n");
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  ASSERT_GE(sock.fd, 0);
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.not-fail-closed");
  EXPECT_EQ(f[0].severity, Severity::warning);
  EXPECT_NE(f[0].fix.find("--enforcement both"), std::string::npos) << f[0].fix;
  EXPECT_NE(f[0].fix.find("upgrade containerd to 2.2"), std::string::npos) << f[0].fix;
}

TEST_F(DoctorChecks, NriPluginThatNeverReportedIsDown) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.plugin-down");
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_NE(f[0].summary.find("never reported"), std::string::npos) << f[0].summary;
  EXPECT_NE(f[0].summary.find("every container create fails"), std::string::npos)
      << "required_plugins is set: " << f[0].summary;
}

TEST_F(DoctorChecks, NriPluginWhosePidIsAnotherProcessNowIsDown) {
  m_node->write("etc/gpufence/install-state.json", state("both"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  // The status says connected, but pid 4242 started at another time: a reused pid.
  write_nri_status(*m_node, nri::NriState::connected, 99, 1234);
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.plugin-down");
  EXPECT_NE(f[0].summary.find("not running"), std::string::npos) << f[0].summary;
  // No process at all.
  std::filesystem::remove_all(m_dir / "proc/4242");
  f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].summary.find("not running"), std::string::npos) << f[0].summary;
}

TEST_F(DoctorChecks, NriPluginRunningButNotConnectedIsDown) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  write_nri_status(*m_node, nri::NriState::waiting, 99, 99);
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.plugin-down");
  EXPECT_NE(f[0].summary.find("not connected"), std::string::npos) << f[0].summary;
}

TEST_F(DoctorChecks, NriContainersCreatedWhileItWasDownAreNamed) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  link_nri_plugins(m_dir.path());
  m_node->write("etc/containerd/config.toml",
                kNriRequired +
                    "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n"
                    "  runtime_type = 'io.containerd.runc.v2'\n"
                    "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n"
                    "  BinaryName = '/usr/local/bin/gpufence-runtime'\n");
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  write_nri_status(*m_node, nri::NriState::connected, 99, 99,
                   {{"c1", "default/ds-0", "app\x1b[2J", "", "would grant GPU-1"},
                    // through the shim's handler: enforced there, not reported
                    {"c2", "default/ds-1", "app", "nvidia", "would grant GPU-0"}});
  auto snap = snapshot();
  auto f = nri_findings(judge(snap));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.created-while-down");
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_NE(f[0].summary.find("pod default/ds-0"), std::string::npos) << f[0].summary;
  EXPECT_NE(f[0].evidence.find("would grant GPU-1"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].fix.find("kubectl delete pod -n default ds-0"), std::string::npos) << f[0].fix;
  // The pod's bytes are data in the report: no terminal escape reaches it.
  std::string text = render_doctor_text(snap, judge(snap));
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  // Without an install record the plugin's account still counts (it ran, it saw them).
  std::filesystem::remove(m_dir / "etc/gpufence/install-state.json");
  f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.created-while-down");
}

// The list is what containerd showed at the last Synchronize: a container gone since (its pod
// deleted or recreated) holds nothing now and is not reported, once this node's containers were
// read; a live one still is (seen on a real cluster after the device plugin's pod was recreated).
TEST_F(DoctorChecks, NriCreatedWhileDownDropsContainersGoneSince) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  link_nri_plugins(m_dir.path());
  m_node->write("etc/containerd/config.toml", kNriRequired);
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  write_nri_status(*m_node, nri::NriState::connected, 99, 99,
                   {{"gone", "default/ds-0", "app", "", "would grant GPU-1"},
                    {"live", "default/ds-2", "app", "", "would grant GPU-0"}});
  auto snap = snapshot();
  NodeContainer live;
  live.id = "live";
  live.pod = "ds-2";
  live.pod_namespace = "default";
  live.name = "app";
  snap.containers.push_back(live);
  auto f = nri_findings(judge(snap));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.created-while-down");
  EXPECT_NE(f[0].summary.find("pod default/ds-2"), std::string::npos) << f[0].summary;
}

// An NRI install adds no handler, so the doctor's default handler is missing from containerd's
// config: info while no RuntimeClass names it and gpufence-nri enforces; an error as soon as one
// does (its pods could not start), and without the API server's view.
TEST_F(DoctorChecks, AHandlerNoRuntimeClassNamesIsInfoOnAnNriNode) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  link_nri_plugins(m_dir.path());
  m_node->write("etc/containerd/config.toml", kNriRequired);
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  auto severity_of_missing_handler = [&](const Snapshot& snap) -> std::optional<Severity> {
    for (const auto& f : judge(snap))
      if (f.id == "containerd.handler-missing") return f.severity;
    return std::nullopt;
  };
  auto snap = snapshot();
  EXPECT_EQ(severity_of_missing_handler(snap), Severity::error) << "no API view: it stands";
  snap.kube = KubeView{};
  EXPECT_EQ(severity_of_missing_handler(snap), Severity::info);
  snap.kube->runtime_classes["gpu"] = "nvidia";
  EXPECT_EQ(severity_of_missing_handler(snap), Severity::error) << "a RuntimeClass names it";
}

// gpufence's own pods start before the installer puts gpufence-nri there: info when the pod is
// in the install's namespace and a chart DaemonSet controls it; a tenant's pod listed the same way
// stays an error.
TEST_F(DoctorChecks, OwnPodsCreatedBeforeNriAreInfoATenantsAreNot) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  link_nri_plugins(m_dir.path());
  m_node->write("etc/containerd/config.toml", kNriRequired);
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  write_nri_status(
      *m_node, nri::NriState::connected, 99, 99,
      {{"own", "gpufence/dp-1", "gpufence-device-plugin", "", "would remove /dev/nvidia0"},
       {"tenant", "team/dp-1", "gpufence-device-plugin", "", "would remove /dev/nvidia0"}});
  auto snap = snapshot();
  snap.system_namespace = "gpufence";
  snap.system_daemonsets = {"gpufence-device-plugin"};
  snap.kube = KubeView{};
  for (const auto& [id, ns] : {std::pair{"own", "gpufence"}, std::pair{"tenant", "team"}}) {
    NodeContainer c;
    c.id = id;
    c.pod = "dp-1";
    c.pod_namespace = ns;
    c.name = "gpufence-device-plugin";
    snap.containers.push_back(c);
    KubePod p;
    p.pod_namespace = ns;
    p.name = "dp-1";
    p.daemonset = "gpufence-device-plugin";
    snap.kube->pods.push_back(p);
  }
  std::map<std::string, Severity> by_pod;
  for (const auto& f : judge(snap))
    if (f.id == "nri.created-while-down")
      by_pod[f.summary.find("team/") != std::string::npos ? "tenant" : "own"] = f.severity;
  EXPECT_EQ(by_pod["own"], Severity::info);
  EXPECT_EQ(by_pod["tenant"], Severity::error);
}

// Connected for longer than a judgement takes with none finished (or only an earlier
// connection's): the created-while-down list may be incomplete, and the doctor says so.
TEST_F(DoctorChecks, NriConnectedWithNoJudgementForLongIsReported) {
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml", kNriRequired);
  link_nri_plugins(m_dir.path());
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  for (auto [synced, stale] :
       {std::pair<std::string, bool>{"", false}, {"2026-12-02T03:00:01Z", true}}) {
    write_nri_status(*m_node, nri::NriState::connected, 99, 99, {}, synced, stale);
    auto f = nri_findings(judge(snapshot()));
    ASSERT_EQ(f.size(), 1u) << synced;
    EXPECT_EQ(f[0].id, "nri.sync-unjudged");
    EXPECT_EQ(f[0].severity, Severity::warning);
    EXPECT_NE(f[0].evidence.find(stale ? "(stale)" : "none"), std::string::npos) << f[0].evidence;
  }
  // A finished judgement of this connection: nothing.
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  EXPECT_TRUE(nri_findings(judge(snapshot())).empty());
}

// An install from before the fence (gpufence-nri alone required) or a fence link gone: the
// fence is missing, an error where NRI alone enforces, a warning beside the shim. Where it is
// in place, nothing; install's record names its link.
TEST_F(DoctorChecks, NriFenceNotRequiredOrNotLinkedIsReported) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml",
                "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
                "  enable = true\n  required_plugins = ['gpufence-nri']\n");
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  auto f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.fence-missing");
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_NE(f[0].evidence.find("not in required_plugins"), std::string::npos) << f[0].evidence;
  EXPECT_NE(f[0].evidence.find("no plugin at /opt/nri/plugins/20-gpufence-fence"),
            std::string::npos)
      << f[0].evidence;
  EXPECT_NE(f[0].fix.find("gpufence install --enforcement nri"), std::string::npos) << f[0].fix;
  // Required, but its link gone (a dangling one is gone too).
  m_node->write("etc/containerd/config.toml", kNriRequired);
  std::filesystem::create_directories(m_dir / "opt/nri/plugins");
  std::filesystem::create_symlink("/usr/local/bin/gpufence-nri",
                                  m_dir / "opt/nri/plugins/20-gpufence-fence");
  f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.fence-missing");
  EXPECT_EQ(f[0].evidence.find("required_plugins ("), std::string::npos) << f[0].evidence;
  m_node->write("etc/gpufence/install-state.json", state("both"));
  f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].severity, Severity::warning) << "the shim enforces handler pods";
  // In place: clean.
  m_node->write("usr/local/bin/gpufence-nri", "#!/bin/sh\n");
  EXPECT_TRUE(nri_findings(judge(snapshot())).empty());
  // Install's record names where it put the link.
  m_node->write(
      "etc/gpufence/install-state.json",
      R"({"enforcement": "nri", "nriPlugin": {"binaryLink": "/usr/local/bin/gpufence-nri",)"
      R"( "pluginLink": "/srv/nri/10-gpufence-nri", "fenceLink": "/srv/nri/20-gpufence-fence"}})");
  f = nri_findings(judge(snapshot()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].evidence.find("no plugin at /srv/nri/20-gpufence-fence"), std::string::npos)
      << f[0].evidence;
}

// containerd's config with a waiver key while gpufence-nri is required: any pod can waive
// enforcement. Without the API server the pods carrying it are not checked, and gather says so.
TEST_F(DoctorChecks, NriWaiverKeyInTheConfigIsAnError) {
  write_nri_status(*m_node, nri::NriState::connected, 99, 99);
  m_node->write("etc/gpufence/install-state.json", state("nri"));
  m_node->write("etc/containerd/config.toml",
                kNriRequired + "    tolerate_missing_plugins_annotation = 'gpufence.io/x'\n");
  link_nri_plugins(m_dir.path());
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  auto snap = snapshot();
  auto f = nri_findings(judge(snap));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].id, "nri.waiver-in-config");
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_NE(f[0].summary.find("gpufence.io/x: \"true\" (or gpufence.io/x/pod, "
                              "gpufence.io/x/container.NAME)"),
            std::string::npos)
      << f[0].summary;
  EXPECT_NE(f[0].evidence.find("tolerate_missing_plugins_annotation = \"gpufence.io/x\""),
            std::string::npos)
      << f[0].evidence;
  EXPECT_TRUE(std::any_of(snap.skipped.begin(), snap.skipped.end(), [](const std::string& x) {
    return x.starts_with("pods carrying the NRI waiver annotation gpufence.io/x: not checked");
  })) << join(snap.skipped, "\n");
  // Not about gpufence when gpufence-nri is not required.
  m_node->write("etc/containerd/config.toml",
                "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
                "  enable = true\n  required_plugins = ['other']\n"
                "  tolerate_missing_plugins_annotation = 'gpufence.io/x'\n");
  m_node->write("etc/gpufence/install-state.json", state("runtime"));
  EXPECT_TRUE(nri_findings(judge(snapshot())).empty());
}

// DRA: a node whose GPUs a GPU DRA driver's slices publish advertises no nvidia.com/gpu by
// design (no node.gpu-capacity); a device plugin's count beside such slices serves one GPU twice.
TEST(DoctorDra, SlicesServeTheGpusAndTwoBackendsAreAnError) {
  Snapshot s;
  s.resource_name = "nvidia.com/gpu";
  s.gpu_dra_drivers = GatherOptions{}.gpu_dra_drivers;
  for (unsigned i = 0; i < 2; ++i) {
    NodeGpu g;
    g.gpu.index = i;
    g.gpu.minor = i;
    g.gpu.uuid = "GPU-" + std::to_string(i);
    s.gpus.push_back(g);
  }
  auto ids = [](const std::vector<Finding>& f) {
    std::vector<std::string> out;
    for (const auto& x : f) out.push_back(x.id);
    return out;
  };
  auto has = [&](const std::vector<Finding>& f, const std::string& id) {
    auto v = ids(f);
    return std::find(v.begin(), v.end(), id) != v.end();
  };
  s.kube = KubeView{};
  s.kube->capacity = 0;
  s.kube->allocatable = 0;
  EXPECT_TRUE(has(judge(s), "node.gpu-capacity")) << "no backend at all";
  s.kube->dra_devices["gpufence.io"] = 2;
  EXPECT_FALSE(has(judge(s), "node.gpu-capacity")) << "served by gpufence-dra";
  EXPECT_FALSE(has(judge(s), "node.gpu-two-backends"));
  s.kube->dra_devices = {{"nic.example.com", 2}};
  EXPECT_TRUE(has(judge(s), "node.gpu-capacity")) << "another driver's devices are no GPUs";
  s.kube->dra_devices = {{"gpu.nvidia.com", 2}};
  s.kube->capacity = 2;
  s.kube->allocatable = 2;
  auto f = judge(s);
  ASSERT_TRUE(has(f, "node.gpu-two-backends"));
  auto two = std::find_if(f.begin(), f.end(),
                          [](const Finding& x) { return x.id == "node.gpu-two-backends"; });
  EXPECT_EQ(two->severity, Severity::error);
  EXPECT_NE(two->summary.find("gpu.nvidia.com: 2"), std::string::npos) << two->summary;
}
