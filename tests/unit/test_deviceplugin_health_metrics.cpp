// GPU health as operators see it: which XIDs recover and which stay, the driver's recovery
// action, the transitions (each one a metric, a log line and a Node Event), and the per-GPU
// metrics with the pods holding each GPU.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "deviceplugin/health.hpp"
#include "deviceplugin/metrics.hpp"
#include "kube/client.hpp"
#include "kube/events.hpp"
#include "support/test_api_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

const AliveCheck kAlive = [](const std::string&) { return Status{}; };
const SteadyTime t0{};

HealthOptions recovering(std::set<std::uint64_t> ignored = kDefaultIgnoredXids) {
  HealthOptions o;
  o.recovery = std::chrono::minutes(5);
  o.ignored_xids = std::move(ignored);
  return o;
}

}  // namespace

TEST(HealthPolicy, Xid79StaysUnhealthyWhateverTheRecoveryTime) {
  HealthTracker t({"GPU-a"}, recovering());
  EXPECT_TRUE(t.on_event({"GPU-a", 79, false}, t0, kAlive));
  EXPECT_FALSE(t.healthy("GPU-a"));
  EXPECT_FALSE(t.on_tick(t0 + std::chrono::hours(24), kAlive));
  EXPECT_FALSE(t.healthy("GPU-a")) << t.reason("GPU-a");
  EXPECT_NE(t.reason("GPU-a").find("xid 79"), std::string::npos);
}

TEST(HealthPolicy, ApplicationXidsPerTheConfiguredPolicyThenRecovery) {
  // Default policy: 13, 31, 43 are application errors and never make a GPU Unhealthy.
  HealthTracker ignoring({"GPU-a"}, recovering());
  for (std::uint64_t xid : {13u, 31u, 43u})
    EXPECT_FALSE(ignoring.on_event({"GPU-a", xid, false}, t0, kAlive));
  EXPECT_TRUE(ignoring.healthy("GPU-a"));
  EXPECT_EQ(ignoring.report()[0].xids.at(13), 1u) << "ignored XIDs are still counted";
  // --ignore-xids "" makes them count: Unhealthy, then Healthy after the quiet period.
  HealthTracker strict({"GPU-a"}, recovering({}));
  for (std::uint64_t xid : {13u, 31u, 43u}) strict.on_event({"GPU-a", xid, false}, t0, kAlive);
  EXPECT_FALSE(strict.healthy("GPU-a"));
  EXPECT_FALSE(strict.on_tick(t0 + 4min, kAlive));
  EXPECT_TRUE(strict.on_tick(t0 + 5min, kAlive));
  EXPECT_TRUE(strict.healthy("GPU-a"));
  auto tr = strict.take_transitions();
  ASSERT_EQ(tr.size(), 2u);
  EXPECT_FALSE(tr[0].healthy);
  EXPECT_EQ(tr[0].reason, "xid 13");
  EXPECT_TRUE(tr[1].healthy);
  EXPECT_EQ(tr[1].reason, "xid 43") << "a recovery says what it recovered from";
  EXPECT_TRUE(strict.take_transitions().empty());
  auto r = strict.report()[0];
  EXPECT_EQ(r.to_unhealthy, 1u);
  EXPECT_EQ(r.to_healthy, 1u);
  EXPECT_EQ(r.xids.size(), 3u);
}

TEST(HealthPolicy, TheDriversRecoveryActionHoldsAGpuUntilItSaysNone) {
  HealthTracker t({"GPU-a", "GPU-b"}, recovering());
  EXPECT_FALSE(t.on_recovery_action("GPU-a", GpuRecoveryAction::none, t0));
  EXPECT_TRUE(t.on_recovery_action("GPU-a", GpuRecoveryAction::node_reboot, t0));
  EXPECT_EQ(t.reason("GPU-a"), "recovery action node_reboot");
  EXPECT_EQ(t.awaiting_action(), std::vector<std::string>{"GPU-a"});
  EXPECT_FALSE(t.on_tick(t0 + std::chrono::hours(1), kAlive)) << "no quiet-time recovery";
  EXPECT_TRUE(t.on_recovery_action("GPU-a", GpuRecoveryAction::none, t0 + 1h));
  EXPECT_TRUE(t.healthy("GPU-a"));
  // An XID made it Unhealthy first: the action returning to none does not heal it early.
  t.on_event({"GPU-b", 48, false}, t0, kAlive);
  t.on_recovery_action("GPU-b", GpuRecoveryAction::gpu_reset, t0);
  EXPECT_FALSE(t.on_recovery_action("GPU-b", GpuRecoveryAction::none, t0 + 1min));
  EXPECT_FALSE(t.healthy("GPU-b"));
  EXPECT_TRUE(t.on_tick(t0 + 6min, kAlive)) << "the XID's own recovery";
  // An action first, then an XID: the XID holds it after the action says none (no quiet-time
  // recovery without --health-recovery), and an XID's reason is never replaced by an action's
  // (gpufence-dra's NoExecute taint reads it).
  HealthTracker strict({"GPU-c"}, HealthOptions{});
  strict.on_recovery_action("GPU-c", GpuRecoveryAction::gpu_reset, t0);
  strict.on_event({"GPU-c", 48, false}, t0, kAlive);
  strict.on_recovery_action("GPU-c", GpuRecoveryAction::node_reboot, t0);
  EXPECT_EQ(strict.reason("GPU-c"), "xid 48");
  EXPECT_FALSE(strict.on_recovery_action("GPU-c", GpuRecoveryAction::none, t0 + 1min));
  EXPECT_FALSE(strict.healthy("GPU-c"));
  // XID 154 (the action changed) is counted, never a reason by itself.
  EXPECT_FALSE(t.on_event({"GPU-a", kRecoveryActionChangedXid, false}, t0, kAlive));
}

namespace {

GpuMetricRow row(unsigned index, bool healthy = true) {
  GpuMetricRow r;
  r.gpu.index = index;
  r.gpu.minor = index;
  r.gpu.uuid = "GPU-" + std::to_string(index);
  r.gpu.name = "NVIDIA A2";
  r.health.uuid = r.gpu.uuid;
  r.health.healthy = healthy;
  return r;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(GpuMetrics, EachGpuWithThePodHoldingItLabelledAsDcgmExporterDoes) {
  std::vector<KubeletAllocation> held = {{"video", "ds-0", "app", {"GPU-0"}},
                                         {"video", "web", "nginx", {}}};
  auto text = render_gpu_metrics("nvidia.com/gpu", {row(0), row(1, false)}, held);
  EXPECT_EQ(count(text,
                  "gpufence_gpu_info{resource=\"nvidia.com/gpu\",gpu=\"0\",UUID=\"GPU-0\","
                  "device=\"nvidia0\",modelName=\"NVIDIA A2\",namespace=\"video\",pod=\"ds-0\","
                  "container=\"app\"} 1"),
            1u)
      << text;
  EXPECT_EQ(count(text,
                  "UUID=\"GPU-1\",device=\"nvidia1\",modelName=\"NVIDIA A2\",namespace=\"\","
                  "pod=\"\",container=\"\"} 1"),
            1u)
      << "a free GPU: one series, no holder";
  EXPECT_EQ(count(text, "gpufence_pod_resources_up{resource=\"nvidia.com/gpu\"} 1"), 1u);
  EXPECT_EQ(count(text,
                  "gpufence_gpu_healthy{resource=\"nvidia.com/gpu\",gpu=\"1\",UUID=\"GPU-1\","
                  "device=\"nvidia1\",modelName=\"NVIDIA A2\"} 0"),
            1u);
  std::string bad;
  EXPECT_TRUE(test::prometheus_text_well_formed(text, &bad)) << bad;
}

TEST(GpuMetrics, IndexIdsJoinTooAndAKubeletErrorLeavesHoldersUnknown) {
  std::vector<KubeletAllocation> held = {{"video", "ds-1", "app", {"1"}}};
  auto text = render_gpu_metrics("nvidia.com/gpu", {row(0), row(1)}, held);
  EXPECT_EQ(count(text, "pod=\"ds-1\""), 1u) << text;
  auto down = render_gpu_metrics(
      "nvidia.com/gpu", {row(0)},
      Result<std::vector<KubeletAllocation>>(fail(Errc::rpc, "PodResources List: unavailable")));
  EXPECT_EQ(count(down, "gpufence_pod_resources_up{resource=\"nvidia.com/gpu\"} 0"), 1u);
  EXPECT_EQ(count(down, "pod=\"\""), 1u);
  auto off = render_gpu_metrics("nvidia.com/gpu", {row(0)}, std::nullopt);
  EXPECT_EQ(count(off, "gpufence_pod_resources_up"), 0u) << "not asked: not reported";
}

TEST(GpuMetrics, XidsTransitionsAndTheRecoveryAction) {
  auto r = row(0, false);
  r.health.xids = {{48, 2}, {13, 1}};
  r.health.to_unhealthy = 1;
  r.health.action = GpuRecoveryAction::gpu_reset;
  GpuMetricRow loose;  // XIDs the driver tied to no GPU
  loose.health.xids = {{62, 1}};
  auto text = render_gpu_metrics("nvidia.com/gpu", {r, loose}, std::nullopt);
  EXPECT_EQ(count(text,
                  "gpufence_gpu_xid_errors_total{resource=\"nvidia.com/gpu\",gpu=\"0\","
                  "UUID=\"GPU-0\",xid=\"48\"} 2"),
            1u)
      << text;
  EXPECT_EQ(count(text,
                  "gpufence_gpu_xid_errors_total{resource=\"nvidia.com/gpu\",gpu=\"\","
                  "UUID=\"\",xid=\"62\"} 1"),
            1u);
  EXPECT_EQ(count(text, "to=\"Unhealthy\"} 1"), 1u);
  EXPECT_EQ(count(text, "to=\"Healthy\"} 0"), 1u);
  EXPECT_EQ(count(text,
                  "gpufence_gpu_recovery_action{resource=\"nvidia.com/gpu\",gpu=\"0\","
                  "UUID=\"GPU-0\",action=\"gpu_reset\"} 1"),
            1u);
  std::string bad;
  EXPECT_TRUE(test::prometheus_text_well_formed(text, &bad)) << bad;
}

TEST(GpuMetrics, APodsNamesStayInsideTheirLabels) {
  std::vector<KubeletAllocation> held = {
      {"video", "ds\"} 1\nforged 1\n", "app\\\xff\x1b[2J" + std::string(4000, 'c'), {"GPU-0"}}};
  auto text = render_gpu_metrics("nvidia.com/gpu", {row(0)}, held);
  std::string bad;
  EXPECT_TRUE(test::prometheus_text_well_formed(text, &bad)) << bad;
  EXPECT_EQ(text.find("\nforged 1"), std::string::npos);
}

TEST(GpuMetrics, PluginMetricsAsksTheKubeletAtEachScrape) {
  PluginMetrics m;
  int asked = 0;
  m.set_gpu_rows([] { return std::vector<GpuMetricRow>{row(0)}; });
  m.set_gpu_holders([&]() -> Result<std::vector<KubeletAllocation>> {
    ++asked;
    return std::vector<KubeletAllocation>{{"video", "ds-0", "app", {"GPU-0"}}};
  });
  auto text = m.render("nvidia.com/gpu");
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(count(text, "pod=\"ds-0\""), 1u);
  EXPECT_EQ(count(text, "gpufence_allocations_total"), 3u) << "the plugin's own families stay";
  m.set_gpu_rows(nullptr);
  EXPECT_EQ(count(m.render("nvidia.com/gpu"), "gpufence_gpu_info{"), 0u);
}

TEST(EventQueue, PostsInOrderOffTheCallersThread) {
  test::TempDir dir;
  test::TestApiServer api;
  auto creds = credentials_from_kubeconfig(api.kubeconfig(), (dir / "kc").string());
  ASSERT_TRUE(creds);
  auto kube = make_rest_client(*creds);
  Logger log(LogLevel::off);
  EventQueue q(*kube, {"gpufence.io/device-plugin", "gpu-1"}, log);
  q.post({"v1", "Node", "", "gpu-1", ""}, {"Warning", "HealthChanged", "GPUUnhealthy", "xid 48"});
  q.post({"v1", "Node", "", "gpu-1", ""}, {"Normal", "HealthChanged", "GPUHealthy", "again"});
  q.drain();
  auto posted = api.posted("/apis/events.k8s.io/v1/namespaces/default/events");
  ASSERT_EQ(posted.size(), 2u);
  EXPECT_EQ(posted[0]["reason"], "GPUUnhealthy");
  EXPECT_EQ(posted[1]["reason"], "GPUHealthy");
  EXPECT_EQ(posted[0]["regarding"]["kind"], "Node");
  EXPECT_EQ(api.rejected(), 0);
  EXPECT_EQ(q.failed(), 0u);
}

TEST(EventQueue, AStalledApiServerNeverBlocksThePosterAndOldEventsAreDropped) {
  // An API server that takes each request and does not answer until released.
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  int in_flight = 0;
  std::vector<std::string> posted;
  Logger log(LogLevel::off);
  {
    EventQueue q(
        [&](const EventRegarding&, const KubeEvent& e) -> Status {
          std::unique_lock lock(mu);
          ++in_flight;
          cv.notify_all();
          cv.wait(lock, [&] { return released; });
          posted.push_back(e.note);
          return {};
        },
        log, 4);
    q.post({"v1", "Node", "", "gpu-1", ""}, {"Warning", "HealthChanged", "GPUUnhealthy", "first"});
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight == 1; });
    }
    auto began = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i)
      q.post({"v1", "Node", "", "gpu-1", ""},
             {"Warning", "HealthChanged", "GPUUnhealthy", std::to_string(i)});
    EXPECT_LT(std::chrono::steady_clock::now() - began, 1s) << "posting never waits";
    EXPECT_EQ(q.dropped(), 96u) << "four wait; the older ones are dropped";
    {
      std::lock_guard lock(mu);
      released = true;
    }
    cv.notify_all();
    q.drain();
  }
  EXPECT_EQ(posted, (std::vector<std::string>{"first", "96", "97", "98", "99"}));
}
