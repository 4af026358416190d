// The doctor's judge as a table of {id, check}: ids unique and documented, every check can
// fire, and each emits only its own id. Plus the doctor's view of containerd's annotation and CDI
// settings on a fake node.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "common/strings.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/parse.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

// A node where every check has something to say.
Snapshot troubled_node() {
  Snapshot s;
  auto gpus = test::fake_gpus(2);
  s.gpus = {{gpus[0], {}}, {gpus[1], {{100, 1}, {200, 1}}}};
  auto container = [&](std::string pod, unsigned pid, std::set<unsigned> openable) {
    NodeContainer c;
    c.id = std::string(64, pod[0]);
    c.pod = pod;
    c.pod_namespace = "default";
    c.name = "main";
    c.pids = {pid};
    c.openable = openable;
    c.openable_source = "devices.list";
    c.gpu_nodes_present = openable;
    return c;
  };
  NodeContainer a = container("a", 100, {0, 1});
  a.nvidia_visible_devices = gpus[1].uuid;  // allocated GPU 0
  a.app_gpu_ids["/app/ds.txt"] = {3};
  a.left_cgroup = {"pid 100 in devices cgroup /"};
  a.host_pid = true;
  a.cap_eff = 1ULL << kCapSysPtrace;
  a.writable_sysfs = {"/host/pci (sysfs /bus/pci)"};
  NodeContainer b = container("b", 200, {0, 1});
  b.has_cap_sys_admin = true;
  NodeContainer c = container("c", 300, {0});
  s.containers = {a, b, c};
  s.allocations = std::vector<KubeletAllocation>{{"default", "a", "main", {gpus[0].uuid}},
                                                 {"default", "b", "main", {gpus[1].uuid}},
                                                 {"default", "c", "main", {}},
                                                 {"default", "stuck", "main", {gpus[1].uuid}}};
  s.allocatable = std::vector<std::string>{};
  // Pod a's stored answer gives GPU 0 by GPU 1's minor: a reboot renumbered them.
  s.checkpoint = {{"uid-a", "main", {gpus[0].uuid}, {gpus[1].minor}}};
  s.checkpoint_path = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
  KubeView kube;
  kube.capacity = 0;
  kube.allocatable = 0;
  kube.pods = {{"default", "p1", "gpu-class", 1, false, {}},
               {"default", "p2", "", 1, true, {"main: all"}}};
  // Allocated a GPU an hour ago; none of its containers runs (its sandbox never came up).
  s.taken_at = std::chrono::system_clock::now();
  KubePod stuck{"default", "stuck", "", 1, false, {}};
  stuck.phase = "Pending";
  stuck.started = s.taken_at - std::chrono::hours(1);
  kube.pods.push_back(stuck);
  s.kube = kube;
  // /var/run/cdi (priority 1) holds two nvidia.com/gpu specs sharing names, the conflict; the
  // /etc/cdi one is overridden (upstream's priority) and the plugin's own kind shares names with
  // both without conflict.
  s.cdi_specs = {{"/etc/cdi/nvidia.yaml", 0, "nvidia.com/gpu", {"0", "1", "all"}, ""},
                 {"/etc/cdi/nic.yaml", 0, "example.com/nic", {"0"}, ""},
                 {"/var/run/cdi/gpufence.io-gpu.json", 1, "gpufence.io/gpu", {"0", "1", "all"}, ""},
                 {"/var/run/cdi/nvidia.yaml", 1, "nvidia.com/gpu", {"0", "all"}, ""},
                 {"/var/run/cdi/operator.yaml", 1, "nvidia.com/gpu", {"0", "all"}, ""}};
  s.containerd_findings = {{"containerd.handler-missing", Severity::error, "x", "y", "z"}};
  // Installed for NRI enforcement on a containerd whose config has NRI off.
  NriView nri;
  nri.enforcement = "nri";
  nri.state_file = "/etc/gpufence/install-state.json";
  s.nri = nri;
  return s;
}

std::vector<std::string> ids(const std::vector<Finding>& f) {
  std::vector<std::string> out;
  for (const auto& x : f) out.push_back(x.id);
  return out;
}

}  // namespace

// Ids are what users, scripts and docs name a finding by: one check per id, and each one named
// in docs/doctor.md.
TEST(DoctorTable, IdsAreUniqueAndDocumented) {
  const auto& ids = doctor_check_ids();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size()) << "ids are unique";
  std::ifstream in(test::source_path("docs/doctor.md"));
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  ASSERT_FALSE(doc.empty()) << "docs/doctor.md not read";
  for (const auto& id : ids)
    EXPECT_NE(doc.find("`" + id + "`"), std::string::npos) << id << " is not in docs/doctor.md";
  EXPECT_TRUE(check_id_matches("containerd.*", "containerd.pod-annotations-cdi"));
  EXPECT_FALSE(check_id_matches("containerd.*", "cdi.duplicate-device"));
  EXPECT_FALSE(check_id_matches("gpu.shared", "gpu.shared-x"));
}

TEST(DoctorTable, EveryCheckFiresAndEmitsOnlyItsOwnId) {
  Snapshot s = troubled_node();
  Snapshot plugin_view = s;  // what only the kubelet's view (no API) can show
  plugin_view.kube.reset();
  plugin_view.allocatable = std::vector<std::string>{s.gpus[0].gpu.uuid};
  Snapshot two_backends = s;  // a device plugin's count beside a GPU DRA driver's slices
  two_backends.kube->capacity = 2;
  two_backends.kube->allocatable = 2;
  two_backends.kube->dra_devices = {{"gpufence.io", 2}};
  two_backends.gpu_dra_drivers = {"gpufence.io"};
  for (const auto& check : doctor_checks()) {
    std::vector<Finding> out;
    check.run(s, out);
    if (out.empty()) check.run(plugin_view, out);
    if (out.empty()) check.run(two_backends, out);
    EXPECT_FALSE(out.empty()) << check.id << " never fires: a check nothing can trigger";
    for (const auto& f : out) {
      EXPECT_TRUE(check_id_matches(check.id, f.id)) << check.id << " emitted " << f.id;
      EXPECT_FALSE(f.fix.empty()) << f.id;
    }
  }
  // judge is all of them, errors first.
  auto all = judge(s);
  EXPECT_GE(all.size(), doctor_checks().size() - 1);
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end(), [](const Finding& x, const Finding& y) {
    return x.severity > y.severity;
  }));
}

TEST(DoctorTable, ACheckpointGivingAGpusOldMinorIsReportedWithTheRemedy) {
  Snapshot s;
  auto gpus = test::fake_gpus(2);
  s.gpus = {{gpus[0], {}}, {gpus[1], {}}};
  s.checkpoint_path = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
  s.checkpoint = {{"uid-a", "app", {gpus[0].uuid}, {gpus[0].minor}},
                  {"uid-b", "app", {gpus[1].uuid}, {gpus[1].minor}},
                  {"uid-c", "app", {"0"}, {gpus[1].minor}},  // index ids say nothing here
                  {"uid-d", "app", {gpus[1].uuid}, {}}};     // no device specs: nothing to judge
  auto judged = [&] {
    std::vector<Finding> out;
    for (const auto& f : judge(s))
      if (f.id == "gpu.checkpoint-renumbered") out.push_back(f);
    return out;
  };
  EXPECT_TRUE(judged().empty());
  std::swap(s.checkpoint[0].device_minors, s.checkpoint[1].device_minors);  // the reboot
  auto f = judged();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_NE(f[0].summary.find("uid-a"), std::string::npos);
  EXPECT_NE(f[0].summary.find(cat("/dev/nvidia", gpus[1].minor, " for ", gpus[0].uuid)),
            std::string::npos)
      << f[0].summary;
  EXPECT_NE(f[0].fix.find("delete the pod"), std::string::npos);
  EXPECT_NE(f[0].evidence.find("kubelet_internal_checkpoint"), std::string::npos);
}

TEST(DoctorTable, DuplicateCdiDevicesNameBothFiles) {
  Snapshot s = troubled_node();
  std::vector<Finding> out;
  for (const auto& c : doctor_checks())
    if (c.id == "cdi.duplicate-device") c.run(s, out);
  ASSERT_EQ(ids(out), std::vector<std::string>{"cdi.duplicate-device"}) << "one finding per pair";
  EXPECT_NE(out[0].summary.find("nvidia.com/gpu=0, nvidia.com/gpu=all"), std::string::npos)
      << out[0].summary;
  EXPECT_EQ(out[0].summary.find("=1"), std::string::npos) << "1 is defined once per directory";
  EXPECT_EQ(out[0].summary.find("gpufence.io"), std::string::npos) << "another kind: no conflict";
  EXPECT_EQ(out[0].evidence, "spec files: /var/run/cdi/nvidia.yaml and /var/run/cdi/operator.yaml");
  s.cdi_specs.pop_back();  // one nvidia.com/gpu spec per directory left: upstream's priority
  out.clear();
  for (const auto& c : doctor_checks())
    if (c.id == "cdi.duplicate-device") c.run(s, out);
  EXPECT_TRUE(out.empty());
}

class DoctorContainerd : public ::testing::Test {
 protected:
  void SetUp() override {
    m_node = std::make_unique<test::FakeNode>(m_dir.path());
    m_inv.list = test::fake_gpus(2);
    m_node->install_gpufence_handler();
  }
  std::vector<std::string> run() {
    return ids(judge(gather_snapshot(HostFs(m_dir.path()), {}, {.inventory = m_inv})));
  }
  bool fired(const std::string& id) {
    auto all = run();
    return std::find(all.begin(), all.end(), id) != all.end();
  }
  void config(const std::string& extra_cri, const std::string& extra_handler) {
    m_node->write("etc/containerd/config.toml",
                  "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n" + extra_cri +
                      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"
                      "runtime_type = \"io.containerd.runc.v2\"\n"
                      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
                      "runtime_type = \"io.containerd.runc.v2\"\n" +
                      extra_handler +
                      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
                      "BinaryName = \"/usr/local/bin/gpufence-runtime\"\n");
  }
  static std::string spec(const std::string& devices, std::string_view kind = "nvidia.com/gpu") {
    std::string out = cat("cdiVersion: \"0.5.0\"\nkind: ", kind, "\ndevices:\n");
    for (std::string_view d : {"0", "1"}) {
      if (devices.find(d) == std::string::npos) continue;
      out += cat("- name: \"", d,
                 "\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia", d, "\n");
    }
    return out;
  }

  test::TempDir m_dir;
  std::unique_ptr<test::FakeNode> m_node;
  test::FakeInventory m_inv;
};

TEST_F(DoctorContainerd, PodAnnotationsThatAdmitCdiAreAnError) {
  config("", "");
  EXPECT_FALSE(fired("containerd.pod-annotations-cdi"));
  config("", "pod_annotations = [\"cdi.k8s.io/*\"]\n");
  EXPECT_TRUE(fired("containerd.pod-annotations-cdi"));
  // Forms only Go's path.Match sees.
  for (const char* p : {"'cdi.k8s.io\\/*'", "\"cdi.k8s.io[/]*\"", "\"cdi.k8s.io[^a]*\""}) {
    config("", cat("pod_annotations = [", p, "]\n"));
    EXPECT_TRUE(fired("containerd.pod-annotations-cdi")) << p;
  }
}

TEST_F(DoctorContainerd, CdiOnWithoutAGpuSpec) {
  config("enable_cdi = true\n", "");
  EXPECT_TRUE(fired("containerd.cdi-no-gpu-spec"));
  m_node->write("etc/cdi/nvidia.yaml", spec("01"));
  EXPECT_TRUE(fired("containerd.cdi-no-gpu-spec"))
      << "NVIDIA's kind resolves no name of the plugin's";
  m_node->write("var/run/cdi/gpufence.io-gpu.yaml", spec("01", "gpufence.io/gpu"));
  EXPECT_FALSE(fired("containerd.cdi-no-gpu-spec"));
}

// nvidia-ctk's spec and the GPU Operator's in one directory: the conflict the CDI cache drops.
// Across directories it is upstream's priority, and beside the plugin's own kind nothing.
TEST_F(DoctorContainerd, TwoSpecsDefiningOneGpu) {
  m_node->write("etc/cdi/nvidia.yaml", spec("01"));
  m_node->write("var/run/cdi/nvidia.yaml", spec("01"));
  m_node->write("var/run/cdi/gpufence.io-gpu.yaml", spec("01", "gpufence.io/gpu"));
  EXPECT_FALSE(fired("cdi.duplicate-device"));
  m_node->write("var/run/cdi/operator.yaml", spec("1"));
  auto snap = gather_snapshot(HostFs(m_dir.path()), {}, {.inventory = m_inv});
  auto findings = judge(snap);
  auto dup = std::find_if(findings.begin(), findings.end(),
                          [](const Finding& f) { return f.id == "cdi.duplicate-device"; });
  ASSERT_NE(dup, findings.end());
  EXPECT_EQ(dup->evidence, "spec files: /var/run/cdi/nvidia.yaml and /var/run/cdi/operator.yaml");
  EXPECT_NE(dup->summary.find(": nvidia.com/gpu=1"), std::string::npos) << dup->summary;
  EXPECT_EQ(std::count_if(findings.begin(), findings.end(),
                          [](const Finding& f) { return f.id == "cdi.duplicate-device"; }),
            1);
}

// GPU pods without runtimeClassName are gpufence-nri's where the node was installed for NRI and
// containerd runs it; where NRI is off, they are still reported.
TEST(DoctorTable, PodsWithoutTheHandlerAreNotReportedWhereGpufenceNriEnforces) {
  auto has = [](const std::vector<Finding>& f, const std::string& id) {
    return std::any_of(f.begin(), f.end(), [&](const Finding& x) { return x.id == id; });
  };
  Snapshot s = troubled_node();
  EXPECT_TRUE(has(judge(s), "pod.no-gpu-runtime"));
  s.nri->enabled = true;
  s.nri->socket_present = true;
  auto f = judge(s);
  EXPECT_FALSE(has(f, "pod.no-gpu-runtime"));
  EXPECT_TRUE(has(f, "nri.not-fail-closed"));
  s.nri->validator_enabled = true;
  s.nri->required_plugins = {"gpufence-nri"};
  EXPECT_FALSE(has(judge(s), "nri.not-fail-closed"));
}
