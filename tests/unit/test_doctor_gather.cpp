// The doctor's gathering with its outside world faked through GatherSources: a PodResources
// answer given as a value (no gRPC server, no kubelet), and what it leads the judge to; a
// kubelet that cannot be reached, noted in `skipped` while the rest is still judged.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/strings.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/report.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

constexpr const char* kSocket = "var/lib/kubelet/pod-resources/kubelet.sock";
constexpr const char* kMicrok8sSocket =
    "var/snap/microk8s/common/var/lib/kubelet/pod-resources/kubelet.sock";

// A kubelet as a value: what each socket path answers, and who asked.
struct FakeKubelet {
  std::map<std::string, Result<PodResourcesView>> answers;  // by the socket path asked
  std::vector<std::string> asked;                           // "socket resource", in order
  PodResourcesReader reader() {
    return [this](const std::string& socket, const std::string& resource) {
      asked.push_back(socket + " " + resource);
      auto it = answers.find(socket);
      if (it == answers.end())
        return Result<PodResourcesView>(fail(Errc::rpc, "no answer for ", socket));
      return it->second;
    };
  }
};

class DoctorGather : public ::testing::Test {
 protected:
  void SetUp() override {
    m_node = std::make_unique<test::FakeNode>(m_dir.path());
    m_inv.list = test::fake_gpus(2);
    m_node->install_gpufence_handler();  // containerd findings out of the way
    // Container "a" in GPU 0's pod, whose devices cgroup lets it open every GPU.
    test::FakeContainer a;
    a.pod = "a";
    a.pids = {100};
    a.dev_minors = {0};
    a.devices_list = "c 195:* rw\n";
    m_node->add(a);
  }
  std::string socket(const char* rel) { return (m_dir / rel).string(); }
  Snapshot gather() {
    return gather_snapshot(HostFs(m_dir.path()), {},
                           {.inventory = m_inv, .read_pod_resources = m_kubelet.reader()});
  }
  static std::vector<std::string> ids(const std::vector<Finding>& findings) {
    std::vector<std::string> out;
    for (const auto& f : findings) out.push_back(f.id);
    return out;
  }
  static PodResourcesView allocated(std::vector<std::string> devices_of_a,
                                    std::vector<std::string> allocatable) {
    return {{{"default", "a", "main", std::move(devices_of_a)}}, std::move(allocatable)};
  }

  test::TempDir m_dir;
  std::unique_ptr<test::FakeNode> m_node;
  test::FakeInventory m_inv;
  FakeKubelet m_kubelet;
};

}  // namespace

TEST_F(DoctorGather, ThePodResourcesAnswerDecidesTheAllocationFindings) {
  m_node->write(kSocket, "");  // the socket's path exists; the fake answers for it
  const auto uuid0 = m_inv.list[0].uuid, uuid1 = m_inv.list[1].uuid;
  m_kubelet.answers.emplace(socket(kSocket), allocated({uuid0}, {uuid0, uuid1}));
  auto snap = gather();
  EXPECT_EQ(m_kubelet.asked, std::vector<std::string>{socket(kSocket) + " nvidia.com/gpu"});
  ASSERT_TRUE(snap.allocations.has_value());
  ASSERT_EQ(snap.allocations->size(), 1u);
  EXPECT_EQ(snap.allocations->at(0).device_ids, std::vector<std::string>{uuid0});
  EXPECT_EQ(snap.allocatable, (std::vector<std::string>{uuid0, uuid1}));
  // Allocated GPU 0, can open GPU 1 too.
  auto findings = judge(snap);
  EXPECT_EQ(ids(findings), std::vector<std::string>{"gpu.open-unallocated"})
      << render_doctor_text(snap, findings);
  for (const auto& s : snap.skipped) EXPECT_EQ(s.find("kubelet"), std::string::npos) << s;

  // Both GPUs allocated to it: nothing to say. GPU 1 not allocatable: the plugin calls it
  // unhealthy.
  m_kubelet.answers.insert_or_assign(socket(kSocket), allocated({uuid0, uuid1}, {uuid0}));
  snap = gather();
  EXPECT_EQ(ids(judge(snap)), std::vector<std::string>{"node.gpu-not-allocatable"})
      << render_doctor_text(snap, judge(snap));
}

// A claim of another DRA driver (NVIDIA's layout: kind k8s.gpu.nvidia.com/claim, one spec per
// claim in /var/run/cdi, names per claim): with its kind listed in runtime.toml, the doctor takes
// the GPU its spec gives, as gpufence-nri does, so the container's GPU 1 is no finding; without
// the listing, or with the spec gone, that GPU reads as unallocated and the reason is named.
TEST_F(DoctorGather, AnotherDriversClaimCountsByItsListedKind) {
  m_node->write(kSocket, "");
  const auto uuid1 = m_inv.list[1].uuid;
  PodResourcesView view = allocated({m_inv.list[0].uuid}, {m_inv.list[0].uuid, uuid1});
  view.allocations[0].other_cdi_names = {"k8s.gpu.nvidia.com/claim=5e1f-gpu-1",
                                         "vendor.example.com/nic=eth0"};
  m_kubelet.answers.emplace(socket(kSocket), view);
  m_node->write("var/run/cdi/k8s.gpu.nvidia.com-claim_5e1f.json",
                R"({"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
                    "devices": [{"name": "5e1f-gpu-1", "containerEdits": {"deviceNodes": [
                      {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}]}}]})");

  auto snap = gather();  // no runtime.toml: no kind listed
  EXPECT_EQ(ids(judge(snap)), std::vector<std::string>{"gpu.open-unallocated"});

  m_node->write("etc/gpufence/runtime.toml", "[cdi]\ngpu_kinds = [\"k8s.gpu.nvidia.com/claim\"]\n");
  snap = gather();
  ASSERT_TRUE(snap.allocations.has_value());
  EXPECT_EQ(snap.allocations->at(0).device_ids,
            (std::vector<std::string>{m_inv.list[0].uuid, uuid1}));
  EXPECT_EQ(ids(judge(snap)), std::vector<std::string>{}) << render_doctor_text(snap, judge(snap));

  std::filesystem::remove(m_dir / "var/run/cdi/k8s.gpu.nvidia.com-claim_5e1f.json");
  snap = gather();
  EXPECT_EQ(ids(judge(snap)), std::vector<std::string>{"gpu.open-unallocated"});
  EXPECT_TRUE(std::ranges::any_of(snap.skipped, [](const std::string& s) {
    return s.find("k8s.gpu.nvidia.com/claim=5e1f-gpu-1 not resolved (unknown CDI device") !=
           std::string::npos;
  })) << join(snap.skipped, "\n");
}

TEST_F(DoctorGather, AnUnreachableKubeletIsSkippedAndTheNextSocketAsked) {
  m_node->write(kSocket, "");
  m_node->write(kMicrok8sSocket, "");
  // The defaults are asked in the distribution table's order: `first`, then `next`.
  const auto order = GatherOptions{}.pod_resources_sockets;
  const auto at = [&](std::string_view rel) {
    return std::find(order.begin(), order.end(), "/" + std::string(rel)) - order.begin();
  };
  ASSERT_LT(at(kSocket), static_cast<long>(order.size()));
  ASSERT_LT(at(kMicrok8sSocket), static_cast<long>(order.size()));
  const char* first = at(kSocket) < at(kMicrok8sSocket) ? kSocket : kMicrok8sSocket;
  const char* next = first == kSocket ? kMicrok8sSocket : kSocket;
  m_kubelet.answers.emplace(socket(first), fail(Errc::rpc, "PodResources List on ", socket(first),
                                                ": failed to connect to all addresses"));
  auto snap = gather();
  EXPECT_EQ(m_kubelet.asked.size(), 2u) << "the next socket is asked after the first fails";
  EXPECT_FALSE(snap.allocations.has_value());
  EXPECT_FALSE(snap.allocatable.has_value());
  // The last socket's reason is the one given, and the allocation checks say they were skipped.
  auto skipped = join(snap.skipped, "\n");
  EXPECT_NE(skipped.find("kubelet: no answer for " + socket(next) + "; allocation checks skipped"),
            std::string::npos)
      << skipped;
  // What needs no allocation is still gathered and judged; what does is not guessed.
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_TRUE(snap.containers[0].openable.has_value());
  EXPECT_EQ(snap.gpus.size(), 2u);
  auto findings = ids(judge(snap));
  EXPECT_EQ(std::count(findings.begin(), findings.end(), "gpu.open-unallocated"), 0)
      << "no allocation is known, so none is judged";

  // The next kubelet answers: its view is used and nothing about the kubelet is skipped.
  const auto uuid0 = m_inv.list[0].uuid;
  m_kubelet.answers.emplace(socket(next), allocated({uuid0}, {uuid0}));
  m_kubelet.asked.clear();
  snap = gather();
  EXPECT_EQ(m_kubelet.asked.size(), 2u);
  ASSERT_TRUE(snap.allocations.has_value());
  EXPECT_EQ(snap.allocations->at(0).device_ids, std::vector<std::string>{uuid0});
  for (const auto& s : snap.skipped) EXPECT_EQ(s.find("kubelet"), std::string::npos) << s;
}

TEST_F(DoctorGather, NoSocketAtAllAsksNobody) {
  auto snap = gather();
  EXPECT_TRUE(m_kubelet.asked.empty());
  auto skipped = join(snap.skipped, "\n");
  EXPECT_NE(skipped.find("kubelet: no PodResources socket at " +
                         join(GatherOptions{}.pod_resources_sockets, ", ")),
            std::string::npos)
      << skipped;
}

TEST_F(DoctorGather, AbsentSourcesAreNamedInSkippedInOrder) {
  auto snap =
      gather_snapshot(HostFs(m_dir.path()), {},
                      {.inventory = fail(Errc::nvml, "cannot load NVML library x"),
                       .kube = fail(Errc::io, "open /nonexistent: No such file or directory"),
                       .read_pod_resources = m_kubelet.reader()});
  ASSERT_GE(snap.skipped.size(), 3u);
  EXPECT_EQ(snap.skipped[0], "Kubernetes API: open /nonexistent: No such file or directory");
  EXPECT_EQ(snap.skipped[1], "NVML: cannot load NVML library x");
  EXPECT_TRUE(snap.gpus.empty());
  EXPECT_FALSE(snap.kube.has_value());
  // The default: the API was not asked for.
  snap = gather();
  ASSERT_FALSE(snap.skipped.empty());
  EXPECT_EQ(snap.skipped[0], "Kubernetes API: not asked (--kubeconfig or --in-cluster)");
}
