// gpufence-nri's decision (src/nri/adjust.hpp) on a fake node: the shim's edit turned into the
// adjustment containerd applies, per NRI version; the allocation only from the kubelet's
// channels; refusals where the shim refuses or where the runtime cannot carry the edit. Device
// nodes need mknod: these tests need root and skip without it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "nri/adjust.hpp"
#include "nri/handler.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace gpufence::nri;

namespace {

constexpr const char* kUuid0 = "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01";
constexpr const char* kUuid1 = "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2";

class NriDecide : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to mknod fake GPU nodes (195:N)";
    for (unsigned i = 0; i < 2; ++i) {
      make_node("dev/nvidia" + std::to_string(i), 195, i);
      std::string bus = "0000:0" + std::to_string(i + 1) + ":00.0";
      m_root.write("proc/driver/nvidia/gpus/" + bus + "/information",
                   cat("Model: \t\t Fake\nGPU UUID: \t ", i == 0 ? kUuid0 : kUuid1,
                       "\nBus Location: \t ", bus, "\nDevice Minor: \t ", i, "\n"));
    }
    make_node("dev/nvidiactl", 195, 255);
    m_root.write("proc/devices",
                 "Character devices:\n  1 mem\n  5 ttyS\n195 nvidia-frontend\n\nBlock devices:\n"
                 "  8 sd\n");
    m_config.device_root = m_root.path().string();
    m_config.procfs_gpus_dir = "/nonexistent";  // no driver-procfs hook in these specs
    m_config.nri_status_file = (m_root / "state/nri-status.json").string();
  }

  void make_node(const std::string& rel, unsigned major, unsigned minor) {
    auto path = m_root.path() / rel;
    std::filesystem::create_directories(path.parent_path());
    ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0666, makedev(major, minor)), 0) << path;
  }

  static RuntimeInfo runtime(std::string_view nri_version) {
    RuntimeInfo rt;
    rt.name = "containerd";
    rt.nri = parse_nri_version(nri_version);
    rt.device_rules = rt.nri >= NriVersion{0, 10, 0};
    return rt;
  }

  Result<NriDecision> decide(const api::Container& c, std::string_view nri_version) {
    ShimContext ctx{m_config, m_log,
                    []() -> Result<std::unique_ptr<GpuInventory>> {
                      return fail(Errc::nvml, "no NVML in this test");
                    },
                    "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
    RuntimeInfo rt;
    rt.name = "containerd";
    rt.nri = parse_nri_version(nri_version);
    rt.device_rules = rt.nri >= NriVersion{0, 10, 0};
    return decide_container(m_pod, c, rt, ctx);
  }

  // What CRI makes of an unprivileged container the kubelet gave GPU `minor`.
  static api::Container unprivileged(int minor) {
    api::Container c;
    c.set_id("c1");
    c.set_name("app");
    c.add_env("PATH=/bin");
    auto* lin = c.mutable_linux();
    auto* deny = lin->mutable_resources()->add_devices();
    deny->set_allow(false);
    deny->set_access("rwm");
    if (minor >= 0) {
      auto* d = lin->add_devices();
      d->set_path("/dev/nvidia" + std::to_string(minor));
      d->set_type("c");
      d->set_major(195);
      d->set_minor(minor);
      auto* allow = lin->mutable_resources()->add_devices();
      allow->set_allow(true);
      allow->set_type("c");
      allow->mutable_major()->set_value(195);
      allow->mutable_minor()->set_value(minor);
      allow->set_access("rw");
    }
    return c;
  }
  // A CRI privileged container: every host device and the single allow-all rule.
  static api::Container privileged(int minor) {
    api::Container c = unprivileged(minor);
    auto* rules = c.mutable_linux()->mutable_resources()->mutable_devices();
    rules->Clear();
    auto* all = rules->Add();
    all->set_allow(true);
    all->set_access("rwm");
    for (int m = 0; m < 2; ++m) {
      if (m == minor) continue;
      auto* d = c.mutable_linux()->add_devices();
      d->set_path("/dev/nvidia" + std::to_string(m));
      d->set_type("c");
      d->set_major(195);
      d->set_minor(m);
    }
    return c;
  }

  static std::map<std::string, std::string> env_of(const api::ContainerAdjustment& a) {
    std::map<std::string, std::string> out;
    for (const auto& kv : a.env()) out[kv.key()] = kv.value();
    return out;
  }

  test::TempDir m_root;
  RuntimeConfig m_config;
  Logger m_log{LogLevel::off};
  api::PodSandbox m_pod;
};

}  // namespace

TEST_F(NriDecide, UnprivilegedGetsItsGpuControlNodesAndEnv) {
  auto d = decide(unprivileged(1), "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->shim.granted, (std::vector<std::string>{kUuid1}));
  auto env = env_of(d->adjust);
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], kUuid1);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], kUuid1);
  bool ctl = false;
  for (const auto& dev : d->adjust.linux().devices()) {
    EXPECT_NE(dev.path(), "/dev/nvidia0");
    EXPECT_FALSE(dev.path().starts_with("-"));  // nothing to take away
    if (dev.path() == "/dev/nvidiactl") ctl = dev.major() == 195 && dev.minor() == 255;
  }
  EXPECT_TRUE(ctl);
  // The appended list starts by denying everything, so it alone decides.
  const auto& rules = d->adjust.linux().resources().devices();
  ASSERT_GE(rules.size(), 2);
  EXPECT_FALSE(rules[0].allow());
  EXPECT_EQ(rules[0].type(), "a");
  EXPECT_FALSE(rules[0].has_major());
  EXPECT_EQ(d->rules, "appended");
  for (const auto& r : rules)
    EXPECT_FALSE(r.allow() && r.major().value() == 195 && r.minor().value() == 0);
}

TEST_F(NriDecide, BelowV010OnlyAddingAllowsIsFine) {
  // 2.1's NRI ignores device rules; the control node's allow comes with the node (NRI adds one
  // for every device it adds), nothing is narrowed: no refusal, no gap.
  auto d = decide(unprivileged(0), "v0.8.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->shim.granted, (std::vector<std::string>{kUuid0}));
  EXPECT_TRUE(d->gaps.empty());
}

TEST_F(NriDecide, PrivilegedIsWhitelistedOnV010AndAGapBelow) {
  // A privileged spec lists every host GPU: only the device plugin's annotation says which.
  api::Container c = privileged(0);
  (*c.mutable_annotations())["cdi.k8s.io/gpufence_x"] = std::string("nvidia.com/gpu=") + kUuid0;
  auto d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->shim.admits_all_devices);
  EXPECT_TRUE(d->shim.whitelisted);
  EXPECT_EQ(d->shim.granted, (std::vector<std::string>{kUuid0}));
  const auto& rules = d->adjust.linux().resources().devices();
  ASSERT_GE(rules.size(), 2);
  EXPECT_FALSE(rules[0].allow());
  bool gpu1 = false, gpu0 = false, wildcard_195 = false;
  for (const auto& r : rules) {
    if (!r.allow()) continue;
    if (r.major().value() == 195 && !r.has_minor()) wildcard_195 = true;
    if (r.major().value() == 195 && r.has_minor() && r.minor().value() == 1) gpu1 = true;
    if (r.major().value() == 195 && r.has_minor() && r.minor().value() == 0) gpu0 = true;
  }
  EXPECT_TRUE(gpu0);
  EXPECT_FALSE(gpu1);
  EXPECT_FALSE(wildcard_195);
  // The other GPU's node is asked away (containerd may not forward it: the rules decide).
  bool removal = false;
  for (const auto& dev : d->adjust.linux().devices()) removal |= dev.path() == "-/dev/nvidia1";
  EXPECT_TRUE(removal);

  auto old = decide(c, "v0.8.0");
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ(old->rules, "not-applied");
  ASSERT_FALSE(old->gaps.empty());
  EXPECT_NE(old->gaps.back().find("no device cgroup rules"), std::string::npos);
}

TEST_F(NriDecide, UnprivilegedThatWouldKeepAForeignNodeIsRefusedBelowV010) {
  // The kubelet's device (GPU 0) and a CDI annotation naming GPU 0, plus a node of GPU 1 that
  // something else put there: the shim takes it out; NRI < v0.10 cannot, so the create fails.
  api::Container c = unprivileged(0);
  auto* d = c.mutable_linux()->add_devices();
  d->set_path("/dev/nvidia1");
  d->set_type("c");
  d->set_major(195);
  d->set_minor(1);
  (*c.mutable_annotations())["cdi.k8s.io/gpufence_x"] = std::string("nvidia.com/gpu=") + kUuid0;
  // Two trusted channels disagree: refused on every version, as the shim refuses.
  EXPECT_FALSE(decide(c, "v0.12.0"));
}

TEST_F(NriDecide, PodAnnotationsAndEnvNeverAllocate) {
  api::Container c = unprivileged(-1);
  std::string forged = std::string("nvidia.com/gpu=") + kUuid1;
  (*m_pod.mutable_annotations())["cdi.k8s.io/forged"] = forged;
  c.add_env("NVIDIA_VISIBLE_DEVICES=all");
  // On the pod alone: nothing.
  auto d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->shim.granted.empty());
  EXPECT_EQ(env_of(d->adjust)["NVIDIA_VISIBLE_DEVICES"], "void");
  // On both (pod_annotations let it in, or the pod copied the device plugin's key): the two
  // cannot be told apart, so the creation is refused, never the key silently dropped.
  (*c.mutable_annotations())["cdi.k8s.io/forged"] = forged;
  d = decide(c, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("cdi.k8s.io/forged is set on the pod and on the container"),
            std::string::npos)
      << d.error().message;
  // A key the decision does not read may be on both: left alone.
  m_pod.mutable_annotations()->clear();
  (*m_pod.mutable_annotations())["example.com/team"] = "a";
  (*c.mutable_annotations())["example.com/team"] = "a";
  // The same annotation on the container alone is the device plugin's: it counts.
  d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->shim.granted, (std::vector<std::string>{kUuid1}));
}

TEST_F(NriDecide, CriCdiDeviceNamesAreTheKubeletsChannel) {
  api::Container c = unprivileged(-1);
  c.add_cdi_devices()->set_name(std::string("nvidia.com/gpu=") + kUuid0);
  auto d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->shim.granted, (std::vector<std::string>{kUuid0}));
  EXPECT_EQ(d->shim.channel, Channel::cdi_annotations);
}

// A claim of another DRA driver (NVIDIA's: kind k8s.gpu.nvidia.com/claim, one spec per claim,
// names per claim) arrives only in CRI CDIDevices. Listed in [cdi] gpu_kinds, it is the GPU its
// spec's node is on the host (195:1 here): a privileged container keeps that GPU alone. The
// pod's own annotation naming another claim's device counts for nothing.
TEST_F(NriDecide, AnotherDraDriversClaimIsEnforcedByItsListedKind) {
  test::TempDir cdi;
  cdi.write("k8s.gpu.nvidia.com-claim_5e1f.json",
            R"({"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
                "devices": [{"name": "5e1f-gpu-1",
                             "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
                            {"name": "5e1f-gpu-0",
                             "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]})");
  m_config.cdi_spec_dirs = {cdi.path().string()};
  api::Container c = privileged(1);
  c.add_cdi_devices()->set_name("k8s.gpu.nvidia.com/claim=5e1f-gpu-1");
  (*m_pod.mutable_annotations())["cdi.k8s.io/mine"] = "k8s.gpu.nvidia.com/claim=5e1f-gpu-0";

  // Not listed: no trusted channel names a GPU of a privileged container, so it gets none.
  auto d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->shim.granted.empty());

  m_config.gpu_cdi_kinds = {"k8s.gpu.nvidia.com/claim"};
  d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->shim.granted, (std::vector<std::string>{kUuid1}));
  bool removal = false;
  for (const auto& dev : d->adjust.linux().devices()) removal |= dev.path() == "-/dev/nvidia0";
  EXPECT_TRUE(removal) << "GPU 0's node is asked away";

  // A claim whose spec is gone (unprepared) is refused, not guessed.
  api::Container stale = privileged(1);
  stale.add_cdi_devices()->set_name("k8s.gpu.nvidia.com/claim=0000-gpu-1");
  auto refused = decide(stale, "v0.12.0");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("unknown CDI device"), std::string::npos)
      << refused.error().message;
}

TEST_F(NriDecide, UnknownGpuIdsAreRefused) {
  api::Container c = unprivileged(-1);
  (*c.mutable_annotations())["cdi.k8s.io/x"] =
      "nvidia.com/gpu=GPU-00000000-0000-0000-0000-00000000dead";
  auto d = decide(c, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("container app"), std::string::npos) << d.error().message;
}

TEST_F(NriDecide, APlainContainerIsLeftAloneButMarked) {
  api::Container c = unprivileged(-1);
  auto d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->rules, "unchanged");
  EXPECT_FALSE(d->edited);
  // Only the mark the fence checks: the container's own id.
  api::ContainerAdjustment only_mark;
  (*only_mark.mutable_annotations())[std::string(kDecidedAnnotation)] = c.id();
  EXPECT_EQ(d->adjust.SerializeAsString(), only_mark.SerializeAsString());
}

TEST_F(NriDecide, AnAllowRuleForAnotherGpuIsDeniedOnV010AndRefusedBelow) {
  // CRI's rules let GPU 1 through (mknod would open it) though only GPU 0 is allocated.
  api::Container c = unprivileged(0);
  auto* allow = c.mutable_linux()->mutable_resources()->add_devices();
  allow->set_allow(true);
  allow->set_type("c");
  allow->mutable_major()->set_value(195);
  allow->mutable_minor()->set_value(1);
  allow->set_access("rwm");
  auto d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->rules, "appended");
  for (const auto& r : d->adjust.linux().resources().devices())
    EXPECT_FALSE(r.allow() && r.has_minor() && r.minor().value() == 1);
  // NRI v0.8 would leave that rule in place: the create fails instead.
  auto old = decide(c, "v0.8.0");
  ASSERT_FALSE(old);
  EXPECT_NE(old.error().message.find("applies no device cgroup rules"), std::string::npos)
      << old.error().message;
}

TEST_F(NriDecide, AHookWithoutAFixedEnvironmentIsRefused) {
  // The shim gives such a hook (a CDI spec's) a fixed env and timeout; NRI cannot edit a hook
  // the runtime already put in the spec, so the container is refused rather than run it.
  api::Container c = unprivileged(0);
  auto* hook = c.mutable_hooks()->add_create_container();
  hook->set_path("/usr/bin/nvidia-cdi-hook");
  hook->add_args("nvidia-cdi-hook");
  auto d = decide(c, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("nvidia-cdi-hook"), std::string::npos) << d.error().message;
  hook->add_env("PATH=/usr/bin");
  hook->mutable_timeout()->set_value(30);
  EXPECT_TRUE(decide(c, "v0.12.0"));
}

TEST_F(NriDecide, ADecisionThatHangsIsARefusalBeforeTheRuntimeGivesUp) {
  // An index needs NVML; this NVML hangs until the test lets it go, past the budget (3/4 of the
  // runtime's request timeout). containerd would otherwise drop the plugin and create the
  // container unadjusted. The budget is 750 ms so that the decision that must come in time does,
  // on a loaded machine too.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false, returned = false;
  };
  auto gate = std::make_shared<Gate>();
  ShimContext ctx{m_config, m_log,
                  [gate]() -> Result<std::unique_ptr<GpuInventory>> {
                    std::unique_lock lock(gate->mu);
                    gate->cv.wait_for(lock, std::chrono::seconds(60), [&] { return gate->open; });
                    gate->returned = true;
                    gate->cv.notify_all();
                    return fail(Errc::nvml, "hung");
                  },
                  "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  GpufenceHandler handler(ctx);
  api::ConfigureRequest configure;
  configure.set_runtime_name("containerd");
  configure.set_nri_version("v0.12.0");
  configure.set_request_timeout(1000);
  ASSERT_TRUE(handler.configured(runtime_info(configure)));
  api::Container c = unprivileged(-1);
  (*c.mutable_annotations())["cdi.k8s.io/x"] = "nvidia.com/gpu=0";
  auto start = std::chrono::steady_clock::now();
  auto adjust = handler.create_container(m_pod, c, std::chrono::steady_clock::now());
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(adjust);
  if (!adjust) {
    EXPECT_NE(adjust.error().message.find("no decision within 750 ms"), std::string::npos)
        << adjust.error().message;
  }
  EXPECT_LT(took, std::chrono::milliseconds(750 + 2000)) << "the runtime's timeout is 1000 ms";
  // Another pod's container gets a fresh worker and its decision; the same pod, whose decision
  // is still hung (its volume, say), is refused at once without a thread more.
  api::PodSandbox other = m_pod;
  other.set_uid("another-pod");
  auto next = handler.create_container(other, unprivileged(0), std::chrono::steady_clock::now());
  EXPECT_TRUE(next) << (next ? "" : next.error().message);
  auto same = handler.create_container(m_pod, unprivileged(0), std::chrono::steady_clock::now());
  ASSERT_FALSE(same);
  EXPECT_NE(same.error().message.find("an earlier decision for this pod is still hung"),
            std::string::npos)
      << same.error().message;
  // Let the hung decision end before the fixture it reads goes away; then the pod is decided.
  std::unique_lock lock(gate->mu);
  gate->open = true;
  gate->cv.notify_all();
  gate->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate->returned; });
  lock.unlock();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // decide_container's return
  auto again = handler.create_container(m_pod, unprivileged(0), std::chrono::steady_clock::now());
  EXPECT_TRUE(again) << (again ? "" : again.error().message);
}

namespace {

bool marked(const api::ContainerAdjustment& a, const std::string& id) {
  auto it = a.annotations().find(std::string(kDecidedAnnotation));
  return it != a.annotations().end() && it->second == id;
}

std::vector<std::string> ids_of(const std::vector<UnenforcedContainer>& list) {
  std::vector<std::string> out;
  for (const auto& u : list) out.push_back(u.id);
  return out;
}

}  // namespace

TEST_F(NriDecide, AnAdjustedContainerCarriesTheDecidedMark) {
  auto gpu = decide(unprivileged(0), "v0.12.0");
  ASSERT_TRUE(gpu) << gpu.error().message;
  EXPECT_TRUE(marked(gpu->adjust, unprivileged(0).id()));
  auto priv = decide(privileged(-1), "v0.8.0");  // the gap below v0.10: still decided
  ASSERT_TRUE(priv) << priv.error().message;
  EXPECT_TRUE(marked(priv->adjust, privileged(-1).id()));
  // Nothing to change: marked all the same (the fence lets through only what carries it).
  auto plain = decide(unprivileged(-1), "v0.12.0");
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_TRUE(marked(plain->adjust, unprivileged(-1).id()));
  EXPECT_FALSE(plain->edited);
}

TEST_F(NriDecide, SynchronizeNamesWhatWasCreatedWithoutThePlugin) {
  ShimContext ctx{m_config, m_log,
                  []() -> Result<std::unique_ptr<GpuInventory>> {
                    return fail(Errc::nvml, "no NVML in this test");
                  },
                  "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  const std::string mark(kDecidedAnnotation);
  api::PodSandbox pod;
  pod.set_id("p1");
  pod.set_name("ds");
  pod.set_namespace_("default");
  api::PodSandbox forging = pod;  // a pod that sets the mark itself (pod_annotations copies it)
  forging.set_id("p2");
  (*forging.mutable_annotations())[mark] = "true";
  api::PodSandbox noisy = pod;  // a pod that sets the mark on itself, to look undecided
  noisy.set_id("p3");
  (*noisy.mutable_annotations())[mark] = "decided-by-pod";
  auto in = [](api::Container c, std::string id, std::string pod_id) {
    c.set_id(std::move(id));
    c.set_pod_sandbox_id(std::move(pod_id));
    c.set_state(api::CONTAINER_RUNNING);
    return c;
  };
  std::vector<api::Container> cs;
  cs.push_back(in(unprivileged(0), "decided", "p1"));
  (*cs.back().mutable_annotations())[mark] = "decided";  // the mark is the container's id
  cs.push_back(in(unprivileged(0), "decided-noisy-pod", "p3"));
  (*cs.back().mutable_annotations())[mark] = "decided-noisy-pod";
  cs.push_back(in(unprivileged(1), "gpu-while-down", "p1"));
  cs.push_back(in(privileged(-1), "privileged-while-down", "p1"));
  cs.push_back(in(unprivileged(-1), "plain", "p1"));
  cs.push_back(in(privileged(0), "forged-mark", "p2"));
  (*cs.back().mutable_annotations())[mark] = "true";
  cs.push_back(in(privileged(-1), "stopped", "p1"));
  cs.back().set_state(api::CONTAINER_STOPPED);
  cs.push_back(in(unprivileged(-1), "unknown-gpu", "p1"));
  (*cs.back().mutable_annotations())["cdi.k8s.io/x"] =
      "nvidia.com/gpu=GPU-00000000-0000-0000-0000-00000000dead";

  auto j = judge_synchronized({pod, forging, noisy}, cs, runtime("v0.12.0"), ctx);
  EXPECT_EQ(j.containers, 8);
  EXPECT_EQ(ids_of(j.unenforced),
            (std::vector<std::string>{"gpu-while-down", "privileged-while-down", "forged-mark",
                                      "unknown-gpu"}));
  ASSERT_EQ(j.unenforced.size(), 4u);
  EXPECT_EQ(j.unenforced[0].pod, "default/ds");
  EXPECT_NE(j.unenforced[0].why.find(std::string("grant ") + kUuid1), std::string::npos)
      << j.unenforced[0].why;
  EXPECT_NE(j.unenforced[1].why.find("allow-all"), std::string::npos) << j.unenforced[1].why;
  EXPECT_NE(j.unenforced[3].why.find("refused"), std::string::npos) << j.unenforced[3].why;
}

TEST_F(NriDecide, TheHandlerKeepsItsStatusForTheDoctor) {
  ShimContext ctx{m_config, m_log,
                  []() -> Result<std::unique_ptr<GpuInventory>> {
                    return fail(Errc::nvml, "no NVML in this test");
                  },
                  "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  GpufenceHandler handler(ctx, "/run/nri/nri.sock");
  auto read_status = [&] {
    auto text = read_file(m_config.nri_status_file);
    EXPECT_TRUE(text) << text.error().message;
    auto s = parse_nri_status(text ? *text : "", "status");
    EXPECT_TRUE(s) << s.error().message;
    return s ? *s : NriStatus{};
  };
  handler.disconnected(NriState::waiting);
  EXPECT_EQ(read_status().state, NriState::waiting);

  api::ConfigureRequest configure;
  configure.set_runtime_name("containerd");
  configure.set_runtime_version("v2.3.4");
  configure.set_nri_version("v0.12.0");
  ASSERT_TRUE(handler.configured(runtime_info(configure)));
  // A split Synchronize (v0.8+): judged once its last chunk is in.
  api::SynchronizeRequest first, last;
  *first.add_pods() = m_pod;
  first.set_more(true);
  api::Container c = privileged(-1);
  c.set_id("while-down");
  c.set_state(api::CONTAINER_RUNNING);
  *last.add_containers() = c;
  handler.synchronized(first);
  handler.synchronized(last);
  handler.wait_for_judgement();
  NriStatus s = read_status();
  EXPECT_EQ(s.state, NriState::connected);
  EXPECT_EQ(s.pid, ::getpid());
  EXPECT_GT(s.start_time, 0u);
  EXPECT_EQ(s.socket, "/run/nri/nri.sock");
  EXPECT_EQ(s.runtime_version, "v2.3.4");
  EXPECT_TRUE(s.device_rules);
  EXPECT_EQ(s.containers, 1);
  EXPECT_EQ(ids_of(s.unenforced), (std::vector<std::string>{"while-down"}));
  EXPECT_FALSE(s.synchronized_at.empty());

  // Decisions are counted (outcome, refusal cause, time) and written with the status: by the
  // flusher every few seconds, and at once with every state change.
  api::Container gpu0 = unprivileged(0);
  (*gpu0.mutable_annotations())["cdi.k8s.io/x"] = std::string("nvidia.com/gpu=") + kUuid0;
  api::Container plain = unprivileged(-1);
  plain.set_id("c2");
  api::Container huge = unprivileged(0);
  huge.set_id("c3");
  for (int i = 0; i < 70000; ++i) huge.add_env("K" + std::to_string(i) + "=v");
  auto now = std::chrono::steady_clock::now;
  (void)handler.create_container(m_pod, gpu0, now());
  (void)handler.create_container(m_pod, plain, now());
  EXPECT_FALSE(handler.create_container(m_pod, huge, now())) << "past the env limit";

  handler.disconnected(NriState::waiting);
  s = read_status();
  EXPECT_EQ(s.state, NriState::waiting);
  EXPECT_EQ(ids_of(s.unenforced), (std::vector<std::string>{"while-down"}));  // kept, with its date
  EXPECT_EQ(s.decisions.count, 3u);
  EXPECT_EQ(s.decisions.outcomes["refused"], 1u);
  EXPECT_EQ(s.decisions.outcomes["granted"] + s.decisions.outcomes["no_gpu"], 2u);
  EXPECT_EQ(s.decisions.refusals.size(), 1u);
  EXPECT_EQ(s.decisions.buckets.back(), 3u) << "each took less than a second";
  EXPECT_GT(s.decisions.sum_seconds, 0.0);
}

// Security round 4, item 1: the ~1 MB mountPath of C1 controls (2 bytes each, 4x when escaped,
// 5x when escaped twice) that made the answer exceed ttrpc's 4 MiB. Now refused before anything
// is copied, with a short message, and the next container is decided.
TEST_F(NriDecide, AMegabyteMountPathIsRefusedWithABoundedMessage) {
  std::string path;
  while (path.size() < 930'000) {
    path += "/";
    for (int i = 0; i < 127; ++i) path += "\xc2\x80";
    path += "/..";
  }
  path += "/data";
  api::Container c = unprivileged(0);
  auto* m = c.add_mounts();
  m->set_destination(path);
  m->set_source("/sys/fs/cgroup");
  m->set_type("bind");
  m->add_options("rbind");
  m->add_options("rslave");
  auto d = decide(c, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_LT(d.error().message.size(), 2048u);
  EXPECT_NE(d.error().message.find("longer than 4096 bytes"), std::string::npos)
      << d.error().message.substr(0, 300);
  EXPECT_NE(d.error().message.find("bytes)"), std::string::npos);
  // Under PATH_MAX, the propagation guard refuses it, quoting a bounded excerpt.
  std::string shorter(path.substr(0, 4000));
  c.mutable_mounts(0)->set_destination(shorter);
  d = decide(c, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_LT(d.error().message.size(), 2048u) << d.error().message;
  EXPECT_TRUE(decide(unprivileged(0), "v0.12.0"));
}

TEST_F(NriDecide, RequestsOverALimitAreRefusedNamingIt) {
  api::Container c = unprivileged(0);
  for (int i = 0; i < 24'000; ++i) {
    auto* m = c.add_mounts();
    m->set_destination("/m/" + std::to_string(i));
    m->set_source("/tmp");
    m->set_type("bind");
  }
  auto d = decide(c, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("24000 mounts, above gpufence-nri's limit of 1024"),
            std::string::npos)
      << d.error().message;
  // At the limit, decided (each mount looked up once: linear).
  c.mutable_mounts()->DeleteSubrange(1024, c.mounts_size() - 1024);
  d = decide(c, "v0.12.0");
  ASSERT_TRUE(d) << d.error().message;
  api::Container e = unprivileged(0);
  for (int i = 0; i < 20'000; ++i) e.add_env("K" + std::to_string(i) + "=v");
  EXPECT_FALSE(decide(e, "v0.12.0"));
  api::Container a = unprivileged(0);
  (*a.mutable_annotations())["example.com/big"] = std::string(2u << 20, 'a');
  d = decide(a, "v0.12.0");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("bytes of annotations"), std::string::npos);
}

TEST_F(NriDecide, ADecisionPastItsDeadlineStopsBetweenSteps) {
  ShimContext ctx{m_config, m_log,
                  []() -> Result<std::unique_ptr<GpuInventory>> {
                    return fail(Errc::nvml, "no NVML in this test");
                  },
                  "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  RuntimeInfo rt;
  rt.name = "containerd";
  rt.nri = parse_nri_version("v0.12.0");
  rt.device_rules = true;
  auto d = decide_container(m_pod, unprivileged(0), rt, ctx,
                            std::chrono::steady_clock::now() - std::chrono::seconds(1));
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("no decision within the budget"), std::string::npos);
}

// Security round 4, item 5: the created-while-down list cannot be starved. A slow container is
// listed as not judged (never dropped); reconnects while judging keep the list (marked stale);
// a split Synchronize broken off leaves no ghost.
TEST_F(NriDecide, TheCreatedWhileDownListCannotBeStarved) {
  ShimContext ctx{m_config, m_log,
                  []() -> Result<std::unique_ptr<GpuInventory>> {
                    // NVML answering slower than the budget (a GPU index needs it).
                    std::this_thread::sleep_for(std::chrono::milliseconds(400));
                    return fail(Errc::nvml, "slow NVML");
                  },
                  "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  GpufenceHandler handler(ctx, "/run/nri/nri.sock");
  api::ConfigureRequest configure;
  configure.set_runtime_name("containerd");
  configure.set_nri_version("v0.12.0");
  configure.set_request_timeout(200);  // a budget of 150 ms
  ASSERT_TRUE(handler.configured(runtime_info(configure)));
  auto running = [](api::Container c, std::string id) {
    c.set_id(std::move(id));
    c.set_state(api::CONTAINER_RUNNING);
    return c;
  };
  api::Container slow = running(unprivileged(-1), "slow");
  (*slow.mutable_annotations())["cdi.k8s.io/x"] = "nvidia.com/gpu=0";
  api::SynchronizeRequest sync;
  *sync.add_containers() = slow;
  *sync.add_containers() = running(privileged(-1), "privileged-both-gpus");
  // Reconnects come faster than the judgement: each is a new Synchronize of the same node.
  for (int i = 0; i < 3; ++i) {
    handler.synchronized(sync);
    handler.disconnected(NriState::waiting);
  }
  handler.wait_for_judgement();
  auto text = read_file(m_config.nri_status_file);
  ASSERT_TRUE(text) << text.error().message;
  auto s = parse_nri_status(*text, "status");
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(ids_of(s->unenforced), (std::vector<std::string>{"slow", "privileged-both-gpus"}));
  ASSERT_FALSE(s->unenforced.empty());
  EXPECT_NE(s->unenforced[0].why.find("not judged (too slow"), std::string::npos)
      << s->unenforced[0].why;
  EXPECT_TRUE(s->judgement_stale);  // judged for a connection that has gone since

  // A split Synchronize broken after its first chunk: its containers are not in the next list.
  api::SynchronizeRequest first, last;
  *first.add_containers() = running(privileged(-1), "ghost");
  first.set_more(true);
  handler.synchronized(first);
  handler.disconnected(NriState::waiting);
  *last.add_containers() = running(privileged(-1), "present");
  handler.synchronized(last);
  handler.wait_for_judgement();
  s = parse_nri_status(*read_file(m_config.nri_status_file), "status");
  ASSERT_TRUE(s);
  EXPECT_EQ(ids_of(s->unenforced), (std::vector<std::string>{"present"}));
  EXPECT_FALSE(s->judgement_stale);
}

// Security round 4, item 8: a launched plugin's .conf naming another NVML is the one used.
TEST_F(NriDecide, ALaunchedPluginTakesNvmlLibraryFromItsConf) {
  ShimContext ctx{m_config, m_log,
                  []() -> Result<std::unique_ptr<GpuInventory>> {
                    return fail(Errc::nvml, "the start-up NVML");
                  },
                  "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  GpufenceHandler handler(ctx);
  std::vector<std::string> asked;
  handler.inventory_for = [&](const std::string& library) -> InventoryFactory {
    asked.push_back(library);
    return [library]() -> Result<std::unique_ptr<GpuInventory>> {
      return fail(Errc::nvml, "the .conf's NVML: ", library);
    };
  };
  api::ConfigureRequest configure;
  configure.set_runtime_name("containerd");
  configure.set_nri_version("v0.12.0");
  configure.set_config("[devices]\nnvml_library = \"/opt/nvidia/libnvidia-ml.so.1\"\n");
  ASSERT_TRUE(handler.configured(runtime_info(configure)));
  EXPECT_EQ(asked, (std::vector<std::string>{"/opt/nvidia/libnvidia-ml.so.1"}));
  // An index needs NVML: the refusal names the library the .conf gave.
  api::Container c = unprivileged(-1);
  (*c.mutable_annotations())["cdi.k8s.io/x"] = "nvidia.com/gpu=0";
  auto adjust = handler.create_container(m_pod, c, std::chrono::steady_clock::now());
  ASSERT_FALSE(adjust);
  EXPECT_NE(adjust.error().message.find("/opt/nvidia/libnvidia-ml.so.1"), std::string::npos)
      << adjust.error().message;
}

// gpufence's device plugin is privileged, requests no GPU and opens every GPU through NVML: in a
// namespace of [nri] node_agent_namespaces it keeps them when recreated under NRI (seen on a real
// cluster: otherwise its NVML loses every GPU). Only the kubelet's namespace counts: the same
// container elsewhere, or with a pod annotation or label naming the namespace, loses them.
TEST_F(NriDecide, ANodeAgentNamespaceKeepsItsContainersAsMade) {
  api::Container c = privileged(-1);
  m_config.nri_node_agent_namespaces = {"gpufence"};
  m_pod.set_namespace_("gpufence");
  auto agent = decide(c, "v0.12.0");
  ASSERT_TRUE(agent) << agent.error().message;
  EXPECT_TRUE(agent->node_agent);
  EXPECT_EQ(agent->adjust.linux().devices_size(), 0);
  EXPECT_EQ(agent->adjust.linux().resources().devices_size(), 0);
  EXPECT_EQ(agent->adjust.annotations().at(std::string(kDecidedAnnotation)), "c1");

  m_pod.set_namespace_("tenant");
  (*m_pod.mutable_annotations())["io.kubernetes.pod.namespace"] = "gpufence";
  (*m_pod.mutable_labels())["io.kubernetes.pod.namespace"] = "gpufence";
  auto tenant = decide(c, "v0.12.0");
  ASSERT_TRUE(tenant) << tenant.error().message;
  EXPECT_FALSE(tenant->node_agent);
  bool removed0 = false, removed1 = false;
  for (const auto& dev : tenant->adjust.linux().devices()) {
    removed0 |= dev.path() == "-/dev/nvidia0";
    removed1 |= dev.path() == "-/dev/nvidia1";
  }
  EXPECT_TRUE(removed0 && removed1) << tenant->adjust.ShortDebugString();
}
