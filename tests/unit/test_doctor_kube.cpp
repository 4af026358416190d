// The doctor with the API server's view, against a test API server (none can be installed here):
// kubeconfig reading, the pod/RuntimeClass/capacity checks, and API failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "common/file.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "kube/client.hpp"
#include "kube/quantity.hpp"
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
  std::vector<std::string> run() {
    auto creds = credentials_from_kubeconfig(m_api.kubeconfig(), (m_dir / "kubeconfig").string());
    EXPECT_TRUE(creds) << creds.error().message;
    auto client = make_rest_client(*creds);
    m_snap = gather_snapshot(HostFs(m_dir.path()), {},
                             {.inventory = m_inv, .kube = *client, .node_name = "gpu-1"});
    std::vector<std::string> out;
    for (const auto& f : judge(m_snap)) out.push_back(f.id);
    return out;
  }

  test::TempDir m_dir;
  std::unique_ptr<test::FakeNode> m_node;
  test::FakeInventory m_inv;
  test::TestApiServer m_api;
  Snapshot m_snap;
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
