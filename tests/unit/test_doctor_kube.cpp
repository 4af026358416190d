// The doctor with the API server's view, against a test API server (none can be installed here):
// kubeconfig reading, the pod/RuntimeClass/capacity checks, and API failures.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "common/file.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/report.hpp"
#include "kube/client.hpp"
#include "common/utc_time.hpp"
#include "kube/quantity.hpp"
#include "nri/status.hpp"
#include "pod_resources_server.hpp"
#include "support/fake_node.hpp"
#include "support/test_api_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

std::string pod(const std::string& name, const std::string& runtime_class, int gpus,
                bool privileged = false, const std::string& env_value = "") {
  std::string env = env_value.empty() ? ""
                                      : R"(,"env":[{"name":"NVIDIA_VISIBLE_DEVICES","value":")" +
                                            env_value + "\"}]";
  std::string rc = runtime_class.empty() ? "" : R"("runtimeClassName":")" + runtime_class + "\",";
  return R"({"metadata":{"name":")" + name + R"(","namespace":"video"},"spec":{)" + rc +
         R"("containers":[{"name":"deepstream","resources":{"limits":{"nvidia.com/gpu":")" +
         std::to_string(gpus) + R"("}},"securityContext":{"privileged":)" +
         (privileged ? "true" : "false") + "}" + env + "}]}}";
}

class DoctorKube : public ::testing::Test {
 protected:
  void SetUp() override {
    m_node = std::make_unique<test::FakeNode>(m_dir.path());
    m_inv.list = test::fake_gpus(2);
    m_api.set(
        "/api/v1/nodes/gpu-1", 200,
        R"({"status":{"capacity":{"nvidia.com/gpu":"2"},"allocatable":{"nvidia.com/gpu":"2"}}})");
    m_api.set("/apis/node.k8s.io/v1/runtimeclasses", 200,
              R"({"items":[{"metadata":{"name":"nvidia"},"handler":"nvidia"}]})");
    pods({});
    m_node->install_gpufence_handler();
  }
  void pods(const std::vector<std::string>& items) {
    std::string body = R"({"items":[)";
    for (size_t i = 0; i < items.size(); ++i) body += (i ? "," : "") + items[i];
    m_api.set("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1", 200, body + "]}");
  }
  std::vector<std::string> run(GatherOptions opt = {}) {
    auto creds = credentials_from_kubeconfig(m_api.kubeconfig(), (m_dir / "kubeconfig").string());
    EXPECT_TRUE(creds) << creds.error().message;
    auto client = make_rest_client(*creds);
    m_snap = gather_snapshot(HostFs(m_dir.path()), opt,
                             {.inventory = m_inv, .kube = *client, .node_name = "gpu-1"});
    std::vector<std::string> out;
    for (const auto& f : judge(m_snap)) out.push_back(f.id);
    return out;
  }
  // The kubelet's PodResources: which container holds which GPUs.
  void kubelet(std::vector<test::PodAllocation> allocations) {
    m_kubelet = std::make_unique<test::PodResourcesServer>(
        (m_dir / "var/lib/kubelet/pod-resources/kubelet.sock").string(), "nvidia.com/gpu",
        allocations, std::vector<std::string>{m_inv.list[0].uuid, m_inv.list[1].uuid});
    ASSERT_TRUE(m_kubelet->start());
  }
  std::vector<Finding> findings_of(const std::string& id) {
    std::vector<Finding> out;
    for (const auto& f : judge(m_snap))
      if (f.id == id) out.push_back(f);
    return out;
  }

  test::TempDir m_dir;
  std::unique_ptr<test::FakeNode> m_node;
  test::FakeInventory m_inv;
  test::TestApiServer m_api;
  Snapshot m_snap;
  std::unique_ptr<test::PodResourcesServer> m_kubelet;
};

}  // namespace

TEST_F(DoctorKube, CleanClusterIsClean) {
  pods({pod("ds-a", "nvidia", 1), pod("web", "", 0)});
  EXPECT_TRUE(run().empty());
  ASSERT_TRUE(m_snap.kube.has_value());
  EXPECT_EQ(m_snap.kube->pods.size(), 2u);
  EXPECT_EQ(m_snap.kube->capacity, 2);
}

TEST_F(DoctorKube, RuntimeClassMissing) {
  pods({pod("ds-a", "nvidia-gpu", 1)});
  EXPECT_EQ(run(), (std::vector<std::string>{"pod.runtimeclass-missing"}));
}

TEST_F(DoctorKube, RuntimeClassHandlerWithoutContainerdRuntime) {
  m_api.set("/apis/node.k8s.io/v1/runtimeclasses", 200,
            R"({"items":[{"metadata":{"name":"gpu"},"handler":"gpu-handler"}]})");
  pods({pod("ds-a", "gpu", 1)});
  auto found = run();
  EXPECT_NE(std::find(found.begin(), found.end(), "containerd.handler-missing"), found.end());
}

TEST_F(DoctorKube, GpuPodWithoutRuntimeClassOnPlainRunc) {
  pods({pod("ds-a", "", 1, /*privileged=*/true)});
  auto findings = judge((run(), m_snap));
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].id, "pod.no-gpu-runtime");
  EXPECT_EQ(findings[0].severity, Severity::error) << "privileged: it sees every GPU";
  // With the gpufence handler as containerd's default, the same pod is fine.
  m_node->write(
      "etc/containerd/config.toml",
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = "
      "\"nvidia\"\n"
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\nruntime_type = "
      "\"io.containerd.runc.v2\"\n"
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = "
      "\"/usr/local/bin/gpufence-runtime\"\n");
  EXPECT_TRUE(run().empty());
}

// A pod whose GPU is requested by an init container only (or by requests, not limits) holds a
// GPU as the scheduler and the kubelet count it: the doctor judges it a GPU pod too.
TEST_F(DoctorKube, AGpuRequestedByAnInitContainerMakesAGpuPod) {
  pods({R"({"metadata":{"name":"init-gpu","namespace":"video"},"spec":{
             "initContainers":[{"name":"warm","resources":{"requests":{"nvidia.com/gpu":"2"}}}],
             "containers":[{"name":"main","securityContext":{"privileged":true}}]}})"});
  auto findings = judge((run(), m_snap));
  ASSERT_TRUE(m_snap.kube.has_value());
  ASSERT_EQ(m_snap.kube->pods.size(), 1u);
  EXPECT_EQ(m_snap.kube->pods[0].gpus, 2) << "the init container's request counts";
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].id, "pod.no-gpu-runtime");
}

TEST_F(DoctorKube, PodSetsVisibleDevices) {
  pods({pod("ds-a", "nvidia", 1, false, "all")});
  EXPECT_EQ(run(), (std::vector<std::string>{"pod.env-visible-devices"}));
}

// containerd requires gpufence-nri and lets pods waive it with an annotation: the running pods
// that carry it in any form NRI reads (KEY, KEY/pod, KEY/container.NAME) are named, an error
// where the value waives ("true" as Go's ParseBool reads it), a warning where it does not; a
// pod with a key that only starts like it is not one of them.
TEST_F(DoctorKube, PodsCarryingTheNriWaiverAreNamed) {
  m_node->write("etc/containerd/config.toml",
                "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
                "  enable = true\n  required_plugins = ['gpufence-nri']\n"
                "  tolerate_missing_plugins_annotation = 'waive-nri'\n");
  auto annotated = [](const std::string& name, const std::string& key, const std::string& value) {
    return R"({"metadata":{"name":")" + name + R"(","namespace":"tenant","annotations":{")" + key +
           R"(":")" + value + R"("}},"spec":{"containers":[{"name":"app"}]}})";
  };
  pods({annotated("bare", "waive-nri", "true"), annotated("pod-form", "waive-nri/pod", "T"),
        annotated("container-form", "waive-nri/container.app", "1"),
        annotated("says-false", "waive-nri", "false"),
        annotated("lookalike", "waive-nri-not/pod", "true"), pod("plain", "", 0)});
  run();
  std::map<std::string, const Finding*> by_pod;
  auto findings = judge(m_snap);
  for (const auto& f : findings)
    if (f.id == "nri.pod-waiver") by_pod[f.summary.substr(4, f.summary.find(' ', 4) - 4)] = &f;
  ASSERT_EQ(by_pod.size(), 4u);
  for (const char* waives : {"tenant/bare", "tenant/pod-form", "tenant/container-form"}) {
    ASSERT_TRUE(by_pod.count(waives)) << waives;
    EXPECT_EQ(by_pod[waives]->severity, Severity::error) << waives;
  }
  EXPECT_EQ(by_pod["tenant/says-false"]->severity, Severity::warning);
  EXPECT_NE(by_pod["tenant/container-form"]->evidence.find("waive-nri/container.app=1"),
            std::string::npos)
      << by_pod["tenant/container-form"]->evidence;
  EXPECT_EQ(std::count_if(findings.begin(), findings.end(),
                          [](const Finding& f) { return f.id == "nri.waiver-in-config"; }),
            1);
  // With the API server the pods were checked: nothing says they were skipped.
  for (const auto& line : m_snap.skipped) EXPECT_EQ(line.find("waiver"), std::string::npos);
}

TEST_F(DoctorKube, NodeCapacityZeroMeansNoPlugin) {
  m_api.set("/api/v1/nodes/gpu-1", 200,
            R"({"status":{"capacity":{"cpu":"8"},"allocatable":{"cpu":"8"}}})");
  auto findings = judge((run(), m_snap));
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].id, "node.gpu-capacity");
  EXPECT_NE(findings[0].evidence.find("capacity nvidia.com/gpu=0"), std::string::npos);
}

TEST_F(DoctorKube, ApiFailuresAreSkippedNotFatal) {
  m_api.set("/api/v1/nodes/gpu-1", 401, R"({"kind":"Status","message":"Unauthorized","code":401})");
  EXPECT_TRUE(run().empty());
  EXPECT_FALSE(m_snap.kube.has_value());
  bool named = false;
  for (const auto& s : m_snap.skipped)
    named |= s.find("HTTP 401 (Unauthorized)") != std::string::npos;
  EXPECT_TRUE(named);
  m_api.set("/api/v1/nodes/gpu-1", 500, "oops");
  run();
  EXPECT_FALSE(m_snap.kube.has_value());
  m_api.set("/api/v1/nodes/gpu-1", 200, "{not json");
  run();
  EXPECT_FALSE(m_snap.kube.has_value());
}

// --- gpufence's own pods ---

namespace {

// A pod of the API as the chart's DaemonSet makes one (labels, ownerReferences), privileged,
// requesting no GPU; `owner` "" for none.
std::string daemon_pod(const std::string& ns, const std::string& name, const std::string& owner) {
  nlohmann::json meta{{"name", name},
                      {"namespace", ns},
                      {"labels",
                       {{"app.kubernetes.io/name", "gpufence-device-plugin"},
                        {"app.kubernetes.io/part-of", "gpufence"}}}};
  if (!owner.empty())
    meta["ownerReferences"] = {{{"apiVersion", "apps/v1"},
                                {"kind", "DaemonSet"},
                                {"name", owner},
                                {"uid", "u-1"},
                                {"controller", true},
                                {"blockOwnerDeletion", true}}};
  nlohmann::json container{{"name", "gpufence-device-plugin"},
                           {"securityContext", {{"privileged", true}}}};
  return nlohmann::json{{"metadata", meta}, {"spec", {{"containers", {container}}}}}.dump();
}

// Its container on the node: privileged, every GPU open, no GPU request.
test::FakeContainer daemon_container(const std::string& ns, const std::string& pod, unsigned pid) {
  test::FakeContainer c;
  c.pod = pod;
  c.ns = ns;
  c.name = "gpufence-device-plugin";
  c.pids = {pid};
  c.has_cap_sys_admin = true;
  c.devices_list = "c 195:* rwm\n";
  c.dev_minors = {0, 1};
  return c;
}

std::map<std::string, Severity> no_request_by_pod(const std::vector<Finding>& findings) {
  std::map<std::string, Severity> out;
  for (const auto& f : findings) {
    if (f.id != "gpu.no-request-can-open") continue;
    for (const char* pod :
         {"gpufence/gpufence-device-plugin-x7k2p", "tenant/gpufence-device-plugin-x7k2p",
          "gpufence/debug", "gpufence/by-other-daemonset"})
      if (f.summary.find(std::string(pod) + "/") != std::string::npos) out[pod] = f.severity;
  }
  return out;
}

}  // namespace

// The chart's device plugin pod opens every GPU and requests none, as it must: in gpufence's
// namespace and controlled by its DaemonSet (the API server's word), it is info, not an error.
// A tenant's pod made to look the same (labels, name, an ownerReference naming that DaemonSet:
// all the pod's own bytes) in its own namespace is still an error; so is a pod in gpufence's
// namespace no gpufence DaemonSet controls, and so is every one when the namespace is unknown.
TEST_F(DoctorKube, GpufencesOwnPodIsInfoAndATenantsLookalikeIsStillAnError) {
  m_node->add(daemon_container("gpufence", "gpufence-device-plugin-x7k2p", 100));
  m_node->add(daemon_container("tenant", "gpufence-device-plugin-x7k2p", 200));
  m_node->add(daemon_container("gpufence", "debug", 300));
  m_node->add(daemon_container("gpufence", "by-other-daemonset", 400));
  pods({daemon_pod("gpufence", "gpufence-device-plugin-x7k2p", "gpufence-device-plugin"),
        daemon_pod("tenant", "gpufence-device-plugin-x7k2p", "gpufence-device-plugin"),
        daemon_pod("gpufence", "debug", ""),
        daemon_pod("gpufence", "by-other-daemonset", "node-exporter")});
  kubelet({{"gpufence", "gpufence-device-plugin-x7k2p", "gpufence-device-plugin", {}},
           {"tenant", "gpufence-device-plugin-x7k2p", "gpufence-device-plugin", {}},
           {"gpufence", "debug", "gpufence-device-plugin", {}},
           {"gpufence", "by-other-daemonset", "gpufence-device-plugin", {}}});
  GatherOptions opt;
  opt.system_namespace = "gpufence";
  run(opt);
  auto findings = judge(m_snap);
  auto by_pod = no_request_by_pod(findings);
  ASSERT_EQ(by_pod.size(), 4u);
  EXPECT_EQ(by_pod["gpufence/gpufence-device-plugin-x7k2p"], Severity::info);
  EXPECT_EQ(by_pod["tenant/gpufence-device-plugin-x7k2p"], Severity::error)
      << "labels and ownerReferences are the pod's own: another namespace is a tenant's";
  EXPECT_EQ(by_pod["gpufence/debug"], Severity::error) << "no DaemonSet of gpufence's controls it";
  EXPECT_EQ(by_pod["gpufence/by-other-daemonset"], Severity::error);
  for (const auto& f : findings) {
    if (f.severity != Severity::info) continue;
    EXPECT_NE(f.summary.find("gpufence's own pod"), std::string::npos) << f.summary;
    EXPECT_NE(f.evidence.find("controlled by DaemonSet gpufence-device-plugin"), std::string::npos)
        << f.evidence;
  }
  EXPECT_EQ(doctor_exit_code(findings), 1) << "the tenant's pod is still an error";

  run();  // gpufence's namespace unknown: no pod is taken for gpufence's
  findings = judge(m_snap);
  by_pod = no_request_by_pod(findings);
  EXPECT_EQ(by_pod["gpufence/gpufence-device-plugin-x7k2p"], Severity::error);
  for (const auto& f : findings) {
    if (f.summary.find("gpufence/gpufence-device-plugin-x7k2p/") == std::string::npos) continue;
    EXPECT_NE(f.fix.find("run the doctor with --system-namespace"), std::string::npos) << f.fix;
  }

  opt.system_daemonsets = {"node-exporter"};  // the DaemonSets are a list the caller gives
  run(opt);
  by_pod = no_request_by_pod(judge(m_snap));
  EXPECT_EQ(by_pod["gpufence/by-other-daemonset"], Severity::info);
  EXPECT_EQ(by_pod["gpufence/gpufence-device-plugin-x7k2p"], Severity::error);
}

// Without the API server no pod's controller is known: gpufence's own pod stays an error.
TEST_F(DoctorKube, WithoutTheApiNoPodIsTakenForGpufences) {
  m_node->add(daemon_container("gpufence", "gpufence-device-plugin-x7k2p", 100));
  kubelet({{"gpufence", "gpufence-device-plugin-x7k2p", "gpufence-device-plugin", {}}});
  GatherOptions opt;
  opt.system_namespace = "gpufence";
  auto snap = gather_snapshot(HostFs(m_dir.path()), opt, {.inventory = m_inv});
  auto by_pod = no_request_by_pod(judge(snap));
  EXPECT_EQ(by_pod["gpufence/gpufence-device-plugin-x7k2p"], Severity::error);
}

// The fields read for the checks above, in shapes the API never writes: ignored, never a crash
// and never a controller ("controller": "true" is not true).
TEST_F(DoctorKube, LifecycleFieldsOfAnotherShapeAreIgnored) {
  pods({R"({"metadata":{"name":"odd","namespace":"gpufence","uid":7,"ownerReferences":[
             {"apiVersion":"apps/v1","kind":"DaemonSet","name":"gpufence-device-plugin",
              "controller":"true"},"x"]},
           "spec":{"containers":[{"name":"c"}]},
           "status":{"phase":3,"startTime":5,"containerStatuses":[1,{"name":"c","state":"x"},
             {"name":"c","state":{"waiting":"y"}}]}})",
        R"({"metadata":{"name":"odder","namespace":"gpufence","ownerReferences":"x"},
           "spec":{"containers":[{"name":"c"}]},"status":[]})"});
  run();
  ASSERT_TRUE(m_snap.kube.has_value());
  ASSERT_EQ(m_snap.kube->pods.size(), 2u);
  for (const auto& p : m_snap.kube->pods) {
    EXPECT_TRUE(p.daemonset.empty()) << p.name;
    EXPECT_FALSE(p.started) << p.name;
    EXPECT_TRUE(p.waiting.empty()) << p.name;
    EXPECT_TRUE(p.uid.empty()) << p.name;
  }
}

// --- gpufence-nri seen live, with no install record ---

namespace {

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

// gpufence-nri's status naming pid 4242, whose start time in the fake /proc is `proc_start`.
void write_connected_status(const test::FakeNode& node, uint64_t proc_start) {
  nri::NriStatus st;
  st.pid = 4242;
  st.start_time = 99;
  st.state = nri::NriState::connected;
  st.since = "2026-12-02T03:00:00Z";
  st.socket = "/var/run/nri/nri.sock";
  st.synchronized_at = "2026-12-02T03:00:01Z";
  node.write("var/lib/gpufence/nri-status.json", nri::render_nri_status(st));
  std::string stat = "4242 (gpufence-nri) S";
  for (int f = 4; f <= 52; ++f) stat += " " + std::to_string(f == 22 ? proc_start : 0);
  node.write("proc/4242/stat", stat + "\n");
}

}  // namespace

// gpufence-nri run as a DaemonSet (no install record) and connected: it is the enforcement point
// for a GPU pod without a RuntimeClass, privileged or not, so pod.no-gpu-runtime says nothing.
// When the process its status names is gone, nothing enforces and the error is back.
TEST_F(DoctorKube, LiveNriEnforcementWithoutAnInstallRecordCountsForGpuPods) {
  m_node->write("etc/containerd/config.toml",
                "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n");
  ListeningSocket sock(m_dir / "var/run/nri/nri.sock");
  ASSERT_GE(sock.fd, 0);
  write_connected_status(*m_node, 99);
  pods({pod("ds-a", "", 1, /*privileged=*/true)});
  auto found = run();
  EXPECT_EQ(std::count(found.begin(), found.end(), "pod.no-gpu-runtime"), 0)
      << "gpufence-nri is connected: it isolates the pod";
  ASSERT_TRUE(m_snap.nri);
  EXPECT_TRUE(m_snap.nri->live());
  EXPECT_TRUE(m_snap.nri->enforcement.empty()) << "no install record";

  write_connected_status(*m_node, 1234);  // pid 4242 is another process now
  auto errors = (run(), findings_of("pod.no-gpu-runtime"));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].severity, Severity::error);
}

// --- A pod that holds GPUs and never runs ---

namespace {

std::string stuck_pod(const std::string& name, const std::string& runtime_class,
                      std::chrono::seconds age, const std::string& phase = "Pending",
                      const std::string& uid = "uid-stuck") {
  auto started = utc_rfc3339(std::chrono::system_clock::now() - age, SubSecond::none);
  nlohmann::json container{{"name", "deepstream"},
                           {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}};
  nlohmann::json spec{{"containers", {container}}};
  if (!runtime_class.empty()) spec["runtimeClassName"] = runtime_class;
  nlohmann::json waiting{{"name", "deepstream"},
                         {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}};
  return nlohmann::json{
      {"metadata",
       {{"name", name}, {"namespace", "video"}, {"uid", uid}, {"creationTimestamp", started}}},
      {"spec", spec},
      {"status", {{"phase", phase}, {"startTime", started}, {"containerStatuses", {waiting}}}}}
      .dump();
}

}  // namespace

// A RuntimeClass whose handler containerd lacks: the sandbox can never be created, the kubelet
// retries forever and keeps the GPU it allocated at admission. After --gpu-held-after the doctor
// names the pod, the GPU and the cause; not before, not once it runs, not once it finished.
TEST_F(DoctorKube, APodHoldingGpusWithNoContainerRunningIsNamedAfterTheThreshold) {
  m_api.set("/apis/node.k8s.io/v1/runtimeclasses", 200,
            R"({"items":[{"metadata":{"name":"nvidia"},"handler":"nvidia"},)"
            R"({"metadata":{"name":"gpu-typo"},"handler":"nvidia-typo"}]})");
  kubelet({{"video", "stuck", "deepstream", {m_inv.list[1].uuid}}});
  pods({stuck_pod("stuck", "gpu-typo", std::chrono::minutes(12))});
  run();
  auto held = findings_of("pod.gpu-held-without-container");
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].severity, Severity::warning);
  EXPECT_NE(held[0].summary.find("pod video/stuck holds GPU 1 (" + m_inv.list[1].uuid + ")"),
            std::string::npos)
      << held[0].summary;
  EXPECT_NE(held[0].summary.find("for 12 min"), std::string::npos) << held[0].summary;
  EXPECT_NE(held[0].evidence.find("handler nvidia-typo, which containerd's config"),
            std::string::npos)
      << held[0].evidence;
  EXPECT_NE(held[0].evidence.find("waiting: deepstream: ContainerCreating"), std::string::npos)
      << held[0].evidence;

  pods({stuck_pod("stuck", "gpu-typo", std::chrono::minutes(2))});
  EXPECT_TRUE((run(), findings_of("pod.gpu-held-without-container")).empty())
      << "younger than --gpu-held-after (5 min)";
  GatherOptions soon;
  soon.held_after = std::chrono::seconds(60);
  EXPECT_EQ((run(soon), findings_of("pod.gpu-held-without-container")).size(), 1u);

  pods({stuck_pod("stuck", "gpu-typo", std::chrono::minutes(12), "Failed")});
  EXPECT_TRUE((run(), findings_of("pod.gpu-held-without-container")).empty())
      << "a finished pod's GPUs go back";

  pods({stuck_pod("stuck", "gpu-typo", std::chrono::minutes(12))});
  test::FakeContainer running;
  running.pod = "stuck";
  running.ns = "video";
  running.name = "deepstream";
  running.pids = {100};
  running.dev_minors = {1};
  running.devices_list = "c 195:1 rw\n";
  m_node->add(running);
  EXPECT_TRUE((run(), findings_of("pod.gpu-held-without-container")).empty())
      << "a container of it runs";
}

// Without the API server its age is unknown: not judged, and the report says which pods.
TEST_F(DoctorKube, WithoutTheApiAHeldPodIsNamedUnderSkipped) {
  kubelet({{"video", "stuck", "deepstream", {m_inv.list[0].uuid}}});
  auto snap = gather_snapshot(HostFs(m_dir.path()), {}, {.inventory = m_inv});
  for (const auto& f : judge(snap)) EXPECT_NE(f.id, "pod.gpu-held-without-container");
  bool named = false;
  for (const auto& line : snap.skipped)
    named |= line.find("hold GPUs with no container running") != std::string::npos &&
             line.find("video/stuck") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(KubeConfig, ReadsCurrentContextInlineDataAndFiles) {
  test::TempDir dir;
  dir.write("ca.pem", "CA-PEM");
  std::string cfg = R"(apiVersion: v1
current-context: b
clusters:
- name: ca
  cluster: {server: "https://a:6443", certificate-authority-data: "QS1DQQ=="}
- name: cb
  cluster: {server: "https://b:6443/", certificate-authority: ca.pem}
contexts:
- name: a
  context: {cluster: ca, user: ua}
- name: b
  context: {cluster: cb, user: ub}
users:
- name: ua
  user: {token: aaa}
- name: ub
  user: {token: bbb, client-certificate-data: "Q0VSVA==", client-key-data: "S0VZ"}
)";
  auto c = credentials_from_kubeconfig(cfg, (dir / "config").string());
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->server, "https://b:6443");
  EXPECT_EQ(c->ca_pem, "CA-PEM");
  EXPECT_EQ(c->token, "bbb");
  EXPECT_EQ(c->client_cert_pem, "CERT");
  EXPECT_EQ(c->client_key_pem, "KEY");
  EXPECT_FALSE(credentials_from_kubeconfig("current-context: x\n", "k"));
  EXPECT_FALSE(credentials_from_kubeconfig("{{{", "k"));
  auto missing_file = credentials_from_kubeconfig(
      "current-context: a\nclusters: [{name: c, cluster: {server: 'https://x', "
      "certificate-authority: /nope.pem}}]\n"
      "contexts: [{name: a, context: {cluster: c, user: u}}]\n",
      "k");
  ASSERT_FALSE(missing_file);
  EXPECT_NE(missing_file.error().message.find("/nope.pem"), std::string::npos);
}

TEST(KubeConfig, InClusterNeedsTheServiceAccount) {
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  auto c = credentials_in_cluster(HostFs("/"));
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("not in a pod"), std::string::npos);
}

TEST(KubeQuantity, CountsAsTheApiWritesThemAndNeverZeroForWhatItCannotRead) {
  auto list = nlohmann::json::parse(
      R"({"nvidia.com/gpu": "2", "a": 3, "k": "1k", "cpu": "500m", "b": null, "bad": "lots"})");
  EXPECT_EQ(resource_count(list, "nvidia.com/gpu").value(), 2);
  EXPECT_EQ(resource_count(list, "a").value(), 3);
  EXPECT_EQ(resource_count(list, "k").value(), 1000) << "the old reader said 0";
  EXPECT_EQ(resource_count(list, "missing").value(), 0) << "absent is none requested";
  EXPECT_EQ(resource_count(nlohmann::json::array(), "x").value(), 0);
  for (const char* key : {"cpu", "b", "bad"}) {
    auto n = resource_count(list, key);
    ASSERT_FALSE(n) << key << " read as " << *n << "; the old reader said 0";
    EXPECT_NE(n.error().message.find(key), std::string::npos) << n.error().message;
  }
}
