// The doctor as operators watch it: its metrics (what each container can open against its
// allocation), the Node condition GPUIsolation and the Events of new findings, and the agent
// that runs it every interval. Snapshots are built by hand; the API is the test API server.
#include <gtest/gtest.h>

#include <sstream>

#include "common/prometheus.hpp"
#include "doctor/agent.hpp"
#include "doctor/metrics.hpp"
#include "doctor/node_report.hpp"
#include "kube/client.hpp"
#include "support/test_api_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

NodeGpu gpu(unsigned index) {
  NodeGpu g;
  g.gpu.index = index;
  g.gpu.minor = index;
  g.gpu.uuid = "GPU-" + std::to_string(index) + "aaaaaaa-0000-0000-0000-000000000000";
  g.gpu.name = "NVIDIA Test";
  return g;
}

NodeContainer container(std::string ns, std::string pod, std::string name,
                        std::set<unsigned> openable, std::string source = "probe") {
  NodeContainer c;
  c.id = pod + "-" + name;
  c.pod_namespace = std::move(ns);
  c.pod = std::move(pod);
  c.name = std::move(name);
  c.openable = std::move(openable);
  c.openable_source = std::move(source);
  return c;
}

// The seed's node: two GPUs, a pod allocated GPU 0 that can open both (plain runc, leaking), one
// allocated GPU 1 that can open only it (gpufence).
Snapshot seed_node() {
  Snapshot s;
  s.gpus = {gpu(0), gpu(1)};
  s.containers = {container("video", "ds-leaks", "app", {0, 1}),
                  container("video", "ds-isolated", "app", {1})};
  s.allocations =
      std::vector<KubeletAllocation>{{"video", "ds-leaks", "app", {s.gpus[0].gpu.uuid}},
                                     {"video", "ds-isolated", "app", {s.gpus[1].gpu.uuid}}};
  return s;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos && line[0] != '#') out.push_back(line);
  return out;
}

bool well_formed(const std::string& text) {
  std::string bad;
  bool ok = test::prometheus_text_well_formed(text, &bad);
  if (!ok) ADD_FAILURE() << "not a sample line: " << bad;
  return ok;
}

}  // namespace

TEST(DoctorMetrics, AGpuOpenableButNotAllocatedIsASeriesWithAllocatedFalse) {
  Snapshot s = seed_node();
  std::string text = render_doctor_metrics(s, {}, {});
  auto leaks = lines_with(text, "allocated=\"false\"");
  ASSERT_EQ(leaks.size(), 1u) << text;
  EXPECT_NE(leaks[0].find("pod=\"ds-leaks\""), std::string::npos);
  EXPECT_NE(leaks[0].find("UUID=\"" + s.gpus[1].gpu.uuid + "\""), std::string::npos);
  EXPECT_NE(leaks[0].find("gpu=\"1\""), std::string::npos);
  EXPECT_NE(leaks[0].find("device=\"nvidia1\""), std::string::npos);
  EXPECT_NE(leaks[0].find("source=\"probe\""), std::string::npos);
  // The isolated pod: only its own GPU, allocated.
  auto isolated = lines_with(text, "pod=\"ds-isolated\"");
  ASSERT_EQ(isolated.size(), 1u);
  EXPECT_NE(isolated[0].find("allocated=\"true\""), std::string::npos);
  EXPECT_TRUE(well_formed(text));
}

TEST(DoctorMetrics, WithGpufenceNoSeriesSaysAllocatedFalse) {
  Snapshot s = seed_node();
  s.containers[0].openable = std::set<unsigned>{0};
  std::string text = render_doctor_metrics(s, {}, {});
  EXPECT_TRUE(lines_with(text, "allocated=\"false\"").empty()) << text;
  EXPECT_EQ(lines_with(text, "gpufence_container_gpu_access{").size(), 2u);
}

TEST(DoctorMetrics, OwnPodsAndContainersTheKubeletDoesNotListAreLeftOut) {
  Snapshot s = seed_node();
  s.system_namespace = "gpufence";
  s.system_daemonsets = {"gpufence-device-plugin"};
  s.kube = KubeView{};
  KubePod plugin;
  plugin.pod_namespace = "gpufence";
  plugin.name = "gpufence-device-plugin-x";
  plugin.daemonset = "gpufence-device-plugin";
  s.kube->pods.push_back(plugin);
  s.containers.push_back(container("gpufence", "gpufence-device-plugin-x", "plugin", {0, 1}));
  s.allocations->push_back({"gpufence", "gpufence-device-plugin-x", "plugin", {}});
  s.containers.push_back(container("", "", "", {0, 1}));  // made by hand: not the kubelet's
  std::string text = render_doctor_metrics(s, {}, {});
  EXPECT_TRUE(lines_with(text, "gpufence-device-plugin-x").empty()) << text;
  EXPECT_EQ(lines_with(text, "allocated=\"false\"").size(), 1u) << text;
}

TEST(DoctorMetrics, HostileNamesStayInsideTheirLabel) {
  Snapshot s = seed_node();
  std::string evil = "app\"} 1\ngpufence_forged 1\n\\\xff\x1b[31m" + std::string(5000, 'x');
  s.containers[0].name = evil;
  (*s.allocations)[0].container = evil;
  std::string text = render_doctor_metrics(s, {}, {});
  EXPECT_TRUE(well_formed(text)) << text;
  for (const auto& line : lines_with(text, "gpufence_forged"))
    EXPECT_TRUE(line.starts_with("gpufence_container_gpu_access{")) << line;
  for (const auto& line : lines_with(text, "ds-leaks"))
    EXPECT_LT(line.size(), 1500u) << "a label value is bounded";
}

TEST(DoctorMetrics, FindingsAreCountedByIdAndSeverity) {
  std::vector<Finding> findings = {{"gpu.open-unallocated", Severity::error, "a", "", ""},
                                   {"gpu.open-unallocated", Severity::error, "b", "", ""},
                                   {"pod.env", Severity::warning, "c", "", ""}};
  std::string text = render_doctor_metrics(seed_node(), findings, {3, {}, {}});
  EXPECT_EQ(
      lines_with(text, "gpufence_doctor_findings{id=\"gpu.open-unallocated\",severity=\"error\"} 2")
          .size(),
      1u)
      << text;
  EXPECT_EQ(
      lines_with(text, "gpufence_doctor_findings{id=\"pod.env\",severity=\"warning\"} 1").size(),
      1u);
  EXPECT_EQ(lines_with(text, "gpufence_doctor_runs_total 3").size(), 1u);
}

TEST(DoctorMetrics, NriStateOnlyWhereTheNodeEnforcesWithIt) {
  Snapshot s = seed_node();
  EXPECT_TRUE(lines_with(render_doctor_metrics(s, {}, {}), "gpufence_nri").empty());
  s.nri = NriView{};
  s.nri->enforcement = "nri";
  s.nri->validator_enabled = true;
  s.nri->required_plugins = {"gpufence-nri"};
  s.nri->status = nri::NriStatus{};
  s.nri->status->unenforced = {{"c1", "video/x", "app", "", "grant"}};
  s.nri->status->decisions.observe("granted", "", 0.0004);
  s.nri->status->decisions.observe("refused", "invalid", 0.002);
  std::string text = render_doctor_metrics(s, {}, {});
  EXPECT_TRUE(well_formed(text));
  EXPECT_EQ(lines_with(text, "gpufence_nri_decisions_total{outcome=\"granted\"} 1").size(), 1u);
  EXPECT_EQ(lines_with(text, "gpufence_nri_decisions_total{outcome=\"no_gpu\"} 0").size(), 1u);
  EXPECT_EQ(lines_with(text, "gpufence_nri_refusals_total{reason=\"invalid\"} 1").size(), 1u);
  EXPECT_EQ(
      lines_with(text, "gpufence_nri_decision_duration_seconds_bucket{le=\"0.0005\"} 1").size(),
      1u);
  EXPECT_EQ(lines_with(text, "gpufence_nri_decision_duration_seconds_bucket{le=\"+Inf\"} 2").size(),
            1u);
  EXPECT_EQ(lines_with(text, "gpufence_nri_decision_duration_seconds_count 2").size(), 1u);
  EXPECT_EQ(lines_with(text, "gpufence_nri_connected 0").size(), 1u) << text;
  EXPECT_EQ(lines_with(text, "gpufence_nri_fail_closed 1").size(), 1u);
  EXPECT_EQ(lines_with(text, "gpufence_nri_created_while_down 1").size(), 1u);
  s.nri->tolerate_annotation = "gpufence.io/tolerate-missing-nri";  // a waiver a pod holds
  EXPECT_EQ(lines_with(render_doctor_metrics(s, {}, {}), "gpufence_nri_fail_closed 0").size(), 1u);
}

TEST(IsolationCondition, TrueWithoutErrorsFalseNamingThemBounded) {
  auto ok = isolation_condition({{"pod.env", Severity::warning, "w", "", ""}});
  EXPECT_EQ(ok.type, "GPUIsolation");
  EXPECT_EQ(ok.status, "True");
  std::vector<Finding> many;
  for (int i = 0; i < 200; ++i)
    many.push_back({"gpu.open-unallocated", Severity::error,
                    "container video/p" + std::to_string(i) + "/app can open GPU 1\x1b[2J", "",
                    ""});
  auto bad = isolation_condition(many);
  EXPECT_EQ(bad.status, "False");
  EXPECT_EQ(bad.reason, "ErrorFindings");
  EXPECT_NE(bad.message.find("200 errors"), std::string::npos);
  EXPECT_LT(bad.message.size(), 1200u);
  EXPECT_EQ(bad.message.find('\x1b'), std::string::npos);
}

TEST(IsolationCondition, UnknownWhenTheKubeletsAllocationsWereNotRead) {
  auto blind = isolation_condition({}, false);
  EXPECT_EQ(blind.status, "Unknown");
  EXPECT_EQ(blind.reason, "AllocationsUnknown");
  // An error found anyway is still told.
  EXPECT_EQ(
      isolation_condition({{"nri.socket-missing", Severity::error, "s", "", ""}}, false).status,
      "False");
  Snapshot s = seed_node();
  s.allocations.reset();
  EXPECT_EQ(
      lines_with(render_doctor_metrics(s, {}, {}), "gpufence_doctor_pod_resources_up 0").size(),
      1u);
  EXPECT_TRUE(
      lines_with(render_doctor_metrics(s, {}, {}), "gpufence_container_gpu_access{").empty());
}

TEST(IsolationCondition, TheTransitionTimeMovesOnlyWhenTheStatusChanges) {
  nlohmann::json node = {{"status",
                          {{"conditions",
                            {{{"type", "Ready"}, {"status", "True"}},
                             {{"type", "GPUIsolation"},
                              {"status", "True"},
                              {"lastTransitionTime", "2026-01-01T00:00:00Z"}}}}}}};
  auto now = std::chrono::system_clock::time_point(std::chrono::seconds(1796193335));
  auto same = condition_patch(node, {"GPUIsolation", "True", "NoErrorFindings", "m"}, now);
  auto c = same["status"]["conditions"][0];
  EXPECT_EQ(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
  EXPECT_EQ(c["lastHeartbeatTime"], "2026-12-02T06:35:35Z");
  auto changed = condition_patch(node, {"GPUIsolation", "False", "ErrorFindings", "m"}, now);
  EXPECT_EQ(changed["status"]["conditions"][0]["lastTransitionTime"], "2026-12-02T06:35:35Z");
  EXPECT_EQ(changed["status"]["conditions"].size(), 1u) << "only its own condition is sent";
}

TEST(EventReason, FromAFindingId) {
  EXPECT_EQ(event_reason("gpu.open-unallocated"), "GpuOpenUnallocated");
  EXPECT_EQ(event_reason("nri.created-while-down"), "NriCreatedWhileDown");
  EXPECT_EQ(event_reason(""), "Finding");
}

namespace {

class NodeReport : public ::testing::Test {
 protected:
  void SetUp() override {
    m_api.set_versioned("/api/v1/nodes/gpu-1",
                        {{"apiVersion", "v1"},
                         {"kind", "Node"},
                         {"metadata", {{"name", "gpu-1"}}},
                         {"status", {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}});
    auto creds = credentials_from_kubeconfig(m_api.kubeconfig(), (m_dir / "kc").string());
    ASSERT_TRUE(creds) << creds.error().message;
    m_kube = make_rest_client(*creds);
  }
  nlohmann::json condition(const std::string& type) {
    auto node = m_api.object("/api/v1/nodes/gpu-1");
    if (!node.contains("status")) ADD_FAILURE() << node.dump();
    for (const auto& c : node["status"]["conditions"])
      if (c["type"] == type) return c;
    return nullptr;
  }
  test::TempDir m_dir;
  test::TestApiServer m_api;
  std::unique_ptr<KubeClient> m_kube;
};

Finding leak(const std::string& pod) {
  return {"gpu.open-unallocated",
          Severity::error,
          "container " + pod + "/app can open GPU 1",
          "ev",
          "fix",
          pod};
}

}  // namespace

TEST_F(NodeReport, TheConditionIsPatchedBesideTheKubeletsOwn) {
  ASSERT_TRUE(set_node_condition(*m_kube, "gpu-1", isolation_condition({leak("video/a")})));
  EXPECT_EQ(condition("Ready")["status"], "True") << "the kubelet's condition is kept";
  EXPECT_EQ(condition("GPUIsolation")["status"], "False");
  EXPECT_EQ(condition("GPUIsolation")["reason"], "ErrorFindings");
  ASSERT_TRUE(set_node_condition(*m_kube, "gpu-1", isolation_condition({})));
  EXPECT_EQ(condition("GPUIsolation")["status"], "True");
  EXPECT_EQ(m_api.patches(), 2);
  EXPECT_FALSE(set_node_condition(*m_kube, "gpu-2", isolation_condition({})))
      << "an unknown node is an error";
}

TEST_F(NodeReport, EachNewFindingIsOneEventOnItsPodOrTheNode) {
  FindingEvents events("gpu-1", {"gpufence.io/doctor", "gpu-1"});
  std::vector<Finding> now = {leak("video/a"),
                              {"nri.plugin-down", Severity::error, "gpufence-nri is down", "", ""},
                              {"gpu.no-request-can-open", Severity::info, "own pod", "", ""}};
  ASSERT_TRUE(events.post_new(*m_kube, now));
  auto pod_events = m_api.posted("/apis/events.k8s.io/v1/namespaces/video/events");
  auto node_events = m_api.posted("/apis/events.k8s.io/v1/namespaces/default/events");
  ASSERT_EQ(pod_events.size(), 1u);
  ASSERT_EQ(node_events.size(), 1u) << "info findings are not told";
  EXPECT_EQ(pod_events[0]["regarding"]["kind"], "Pod");
  EXPECT_EQ(pod_events[0]["regarding"]["name"], "a");
  EXPECT_EQ(pod_events[0]["reason"], "GpuOpenUnallocated");
  EXPECT_EQ(pod_events[0]["type"], "Warning");
  EXPECT_EQ(node_events[0]["regarding"]["kind"], "Node");
  EXPECT_EQ(m_api.rejected(), 0);
  // The same findings again: nothing new. One gone and back: told again.
  ASSERT_TRUE(events.post_new(*m_kube, now));
  EXPECT_EQ(m_api.posted("/apis/events.k8s.io/v1/namespaces/video/events").size(), 1u);
  ASSERT_TRUE(events.post_new(*m_kube, {now[1]}));
  ASSERT_TRUE(events.post_new(*m_kube, now));
  EXPECT_EQ(m_api.posted("/apis/events.k8s.io/v1/namespaces/video/events").size(), 2u);
}

TEST_F(NodeReport, AFloodOfFindingsIsToldAtMostTwentyARun) {
  FindingEvents events("gpu-1", {"gpufence.io/doctor", "gpu-1"});
  std::vector<Finding> many;
  for (int i = 0; i < 30; ++i) many.push_back(leak("video/p" + std::to_string(i)));
  ASSERT_TRUE(events.post_new(*m_kube, many));
  EXPECT_EQ(m_api.posted("/apis/events.k8s.io/v1/namespaces/video/events").size(),
            kMaxEventsPerRun);
  ASSERT_TRUE(events.post_new(*m_kube, many));
  EXPECT_EQ(m_api.posted("/apis/events.k8s.io/v1/namespaces/video/events").size(), 30u)
      << "the rest the next run";
}

TEST_F(NodeReport, TheAgentRunsReportsAndCountsWhatTheApiRefused) {
  Logger log(LogLevel::off);
  auto t = std::chrono::system_clock::time_point(std::chrono::seconds(1796193335));
  int runs = 0;
  std::vector<Finding> findings = {leak("video/a")};
  DoctorAgent agent(
      [&] {
        ++runs;
        return DoctorRun{seed_node(), findings};
      },
      m_kube.get(), {std::chrono::seconds(60), true, "gpu-1"}, log, [&] { return t; });
  EXPECT_TRUE(agent.fresh()) << "fresh while the first run has three intervals to finish";
  agent.step();
  EXPECT_EQ(condition("GPUIsolation")["status"], "False");
  EXPECT_NE(agent.metrics().find("gpufence_doctor_runs_total 1"), std::string::npos);
  EXPECT_NE(agent.metrics().find("allocated=\"false\""), std::string::npos);
  // Fixed: the condition turns True, and the Node gets an Event saying so.
  findings.clear();
  agent.step();
  EXPECT_EQ(condition("GPUIsolation")["status"], "True");
  auto node_events = m_api.posted("/apis/events.k8s.io/v1/namespaces/default/events");
  ASSERT_EQ(node_events.size(), 1u);
  EXPECT_EQ(node_events[0]["reason"], "GPUIsolationRestored");
  // Unchanged: not patched again until kConditionRefresh has passed.
  agent.step();
  EXPECT_EQ(m_api.patches(), 2);
  t += kConditionRefresh;
  // The API refuses: the run still updates the metrics and counts the failure.
  m_api.set("/api/v1/nodes/gpu-1", 503, R"({"kind":"Status","code":503})");
  agent.step();
  EXPECT_NE(agent.metrics().find("gpufence_doctor_runs_total 4"), std::string::npos);
  EXPECT_NE(agent.metrics().find("gpufence_doctor_report_failures_total 1"), std::string::npos);
  t += std::chrono::minutes(3);
  EXPECT_FALSE(agent.fresh()) << "no run for three intervals";
  int stops = 0;
  agent.run([&](std::chrono::milliseconds wait) {
    EXPECT_EQ(wait, std::chrono::milliseconds(60000));
    return ++stops == 2;
  });
  EXPECT_EQ(runs, 6);
  EXPECT_TRUE(agent.fresh());
}

TEST(PromText, LabelValuesAreEscapedOnceAndEncoded) {
  EXPECT_EQ(prom_label_value("a\"b\\c\nd"), "a\\\"b\\\\\\\\c\\\\x0ad");
  EXPECT_EQ(prom_label_value("GPU-1"), "GPU-1");
  EXPECT_LT(prom_label_value(std::string(10000, 'a')).size(), kMaxLabelValueBytes + 40);
}
