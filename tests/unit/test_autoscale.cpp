// gpufence autoscale: the pure policy and scheduling rules on literal API objects, and the
// controller against a test API server (none can be installed here) that answers 409 on stale
// writes, streams watches and answers 410 once history is compacted, as the real one does.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <regex>
#include <set>

#include "autoscale/controller.hpp"
#include "autoscale/run.hpp"
#include "common/file.hpp"
#include "support/test_api_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;
using json = nlohmann::json;

// metav1.MicroTime, as Events' eventTime and a Lease's renewTime carry it: six digits, "Z".
TEST(AutoscaleEvents, TimesAreMicroTime) {
  const auto t = std::chrono::system_clock::time_point(std::chrono::seconds(1796193335)) +
                 std::chrono::nanoseconds(123456789);
  EXPECT_EQ(micro_time(t), "2026-12-02T06:35:35.123456Z");
  EXPECT_EQ(micro_time(std::chrono::system_clock::time_point(std::chrono::seconds(1796193335))),
            "2026-12-02T06:35:35.000000Z");
}

// An Event's name is client-go's "<regarding>.<hex nanoseconds>", and a valid DNS-1123
// subdomain for any name at all: the API server refused the old generateName "deepstream." (a
// generateName must itself be a subdomain prefix) with 422.
TEST(AutoscaleEvents, NamesAreClientGosFormAndAlwaysAValidSubdomain) {
  const auto t = std::chrono::system_clock::time_point(std::chrono::seconds(1796193335)) +
                 std::chrono::nanoseconds(123456789);
  EXPECT_EQ(event_name("deepstream", t), "deepstream.18ed5c5257f53315");
  const std::regex subdomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  const std::vector<std::string> names = {
      "deepstream", "a", "a.b", "ds-", "-ds", "ds.", ".ds", "a..b", "DeepStream", "ds_1",
      "x/../y", "ds\xc3\xa9", "", ".", "-", "...", std::string(253, 'a'),
      std::string(236, 'a') + "-bcdef", std::string(235, 'a') + ".bcdefg",
      std::string(250, 'a') + ".b-", std::string(300, '-')};
  for (const auto& name : names) {
    auto n = event_name(name, t);
    EXPECT_LE(n.size(), 253u) << name;
    EXPECT_TRUE(std::regex_match(n, subdomain)) << "'" << name << "' -> '" << n << "'";
    EXPECT_TRUE(n.ends_with(".18ed5c5257f53315")) << n;
  }
  EXPECT_EQ(event_name("", t), "gpufence.18ed5c5257f53315");
  EXPECT_EQ(event_name("DS_1..x-", t), "ds-1.x.18ed5c5257f53315");
  EXPECT_EQ(event_name(std::string(253, 'a'), t), std::string(236, 'a') + ".18ed5c5257f53315");
}

// The test API server refuses on create what the real one refuses (so the tests above and the
// cluster scenario would have caught "deepstream."), and stores nothing it refused.
TEST(AutoscaleEvents, TheTestApiServerValidatesACreateAsTheApiServerDoes) {
  test::TestApiServer api;
  auto creds = credentials_from_kubeconfig(api.kubeconfig(), "kubeconfig");
  auto kube = make_rest_client(*creds);
  const std::string events = "/apis/events.k8s.io/v1/namespaces/video/events";
  auto event = [](json meta) {
    return json{{"apiVersion", "events.k8s.io/v1"},
                {"kind", "Event"},
                {"metadata", meta},
                {"eventTime", "2026-12-02T06:35:35.123456Z"},
                {"reportingController", "gpufence.io/autoscale"},
                {"reportingInstance", "a"},
                {"action", "Scale"},
                {"reason", "ScaledUp"},
                {"note", "n"},
                {"type", "Normal"},
                {"regarding", {{"kind", "Deployment"}, {"namespace", "video"}, {"name", "d"}}}};
  };
  auto post = [&](const json& body) { return kube->call("POST", events, body.dump()); };
  auto refused = post(event({{"generateName", "deepstream."}}));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 422);
  EXPECT_NE(refused->body.dump().find(
                "metadata.generateName: Invalid value: \\\"deepstream.\\\": a lowercase RFC 1123"),
            std::string::npos)
      << refused->body.dump();
  EXPECT_EQ(post(event({{"generateName", "deepstream-"}}))->status, 201)
      << "a trailing '-' is masked";
  EXPECT_EQ(post(event({{"name", "Deep"}}))->status, 422);
  EXPECT_EQ(post(event({{"name", std::string(254, 'a')}}))->status, 422);
  EXPECT_EQ(post(event(json::object()))->status, 422) << "no name, no generateName";
  EXPECT_EQ(post(event({{"name", "x"}, {"namespace", "other"}}))->status, 400);
  auto no_time = event({{"name", "y"}});
  no_time.erase("eventTime");
  EXPECT_EQ(post(no_time)->status, 422);
  auto long_reason = event({{"name", "z"}});
  long_reason["reason"] = std::string(129, 'r');
  EXPECT_EQ(post(long_reason)->status, 422);
  EXPECT_EQ(post(event({{"name", "ok.18ed5c5257f53315"}}))->status, 201);
  EXPECT_EQ(api.rejected(), 6);
  EXPECT_EQ(api.posted(events).size(), 2u);
}

// Whatever the Deployment is called, its scale Event is accepted.
TEST(AutoscaleEvents, EveryDeploymentNameGivesAnEventTheApiServerAccepts) {
  test::TestApiServer api;
  auto creds = credentials_from_kubeconfig(api.kubeconfig(), "kubeconfig");
  auto kube = make_rest_client(*creds);
  const std::vector<std::string> names = {"deepstream",
                                          "a",
                                          "ds.v1",
                                          std::string(253, 'd'),
                                          std::string(200, 'd') + "." + std::string(52, 'e'),
                                          "Not-A-Name_",
                                          ""};
  for (const auto& name : names) {
    DeploymentView d;
    d.ns = "video";
    d.name = name;
    d.uid = "uid-1";
    auto st = post_scale_event(*kube, d, EventSource{"gpufence.io/autoscale", "pod-1_7"},
                               ScaleEvent{"Normal", "ScaledUp", "replicas 1 -> 2"});
    EXPECT_TRUE(st) << "'" << name << "': " << st.error().message;
  }
  EXPECT_EQ(api.rejected(), 0);
  EXPECT_EQ(api.posted("/apis/events.k8s.io/v1/namespaces/video/events").size(), 7u);
}

TEST(AutoscalePolicy, StreamsToPodsWithinBoundsAndTolerance) {
  EXPECT_EQ(recommend({16, 8, 1, 0, 10, 1, 5}).replicas, 2);
  EXPECT_EQ(recommend({17, 8, 2, 0, 10, 1, 5}).replicas, 3);
  EXPECT_EQ(recommend({0, 8, 2, 1, 10, 1, 5}).replicas, 1) << "min";
  EXPECT_EQ(recommend({800, 8, 2, 0, 10, 1, 50}).replicas, 10) << "max";
  EXPECT_EQ(recommend({15, 8, 2, 0, 10, 1, 5}).replicas, 2)
      << "15/16 is inside the 10 % band: stay";
  EXPECT_EQ(recommend({13, 8, 2, 0, 10, 1, 5}).replicas, 2) << "ceil(13/8) = 2 anyway";
  EXPECT_EQ(recommend({7, 8, 2, 0, 10, 1, 5}).replicas, 1);
}

TEST(AutoscalePolicy, NeverPastTheFreeGpus) {
  auto r = recommend({40, 8, 1, 0, 10, 1, 1});  // wants 5, one GPU free
  EXPECT_EQ(r.replicas, 2);
  EXPECT_TRUE(r.capped_by_gpus);
  EXPECT_NE(r.reason.find("capped at 2 by 1 free GPU(s)"), std::string::npos) << r.reason;
  EXPECT_EQ(recommend({40, 8, 1, 0, 10, 2, 3}).replicas, 2)
      << "2 GPUs per pod: 3 free GPUs add one pod";
  EXPECT_EQ(recommend({40, 8, 3, 0, 10, 1, 0}).replicas, 3)
      << "no free GPU: no scale-up, no forced scale-down";
}

TEST(AutoscalePolicy, StabilisedLikeTheHpa) {
  Stabilizer st(300s, 15s);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(st.stabilize(5, 4, t0), 5);
  EXPECT_EQ(st.stabilize(2, 5, t0 + 30s), 5) << "a 5 from 30 s ago holds the scale-down";
  EXPECT_EQ(st.stabilize(2, 5, t0 + 301s), 2) << "out of the window";
  EXPECT_EQ(st.stabilize(30, 2, t0 + 302s), 6) << "up by max(100 %, 4 pods)";
  EXPECT_EQ(st.stabilize(30, 6, t0 + 317s), 12);
}

// --- Scheduling rules, as Kubernetes defines them ---

TEST(AutoscaleScheduling, TolerationMatchesAsKubernetesDoes) {
  const json gpu_taint = {
      {"key", "nvidia.com/gpu"}, {"value", "present"}, {"effect", "NoSchedule"}};
  struct Case {
    json toleration;
    bool tolerated;
    const char* why;
  } cases[] = {
      {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}},
       true,
       "Exists ignores the value"},
      {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}}, true, "empty effect: every effect"},
      {{{"operator", "Exists"}}, true, "empty key with Exists: every taint"},
      {{{"key", "nvidia.com/gpu"}, {"operator", "Equal"}, {"value", "present"}},
       true,
       "Equal, same value"},
      {{{"key", "nvidia.com/gpu"}, {"value", "present"}}, true, "no operator means Equal"},
      {{{"key", "nvidia.com/gpu"}, {"operator", "Equal"}, {"value", "absent"}},
       false,
       "Equal, other value"},
      {{{"key", "nvidia.com/gpu"}}, false, "Equal with an empty value against 'present'"},
      {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoExecute"}},
       false,
       "other effect"},
      {{{"key", "other"}, {"operator", "Exists"}}, false, "other key"},
      {{{"key", "nvidia.com/gpu"}, {"operator", "Gt"}, {"value", "1"}},
       false,
       "an operator this code does not know matches nothing"},
  };
  for (const auto& c : cases)
    EXPECT_EQ(tolerates(c.toleration, gpu_taint), c.tolerated) << c.why << ": " << c.toleration;
  const json taints = json::array(
      {{{"key", "a"}, {"effect", "PreferNoSchedule"}}, {{"key", "b"}, {"effect", "NoExecute"}}});
  auto left = untolerated_taint(json::array(), taints);
  ASSERT_TRUE(left) << "NoExecute must be tolerated";
  EXPECT_EQ((*left)["key"], "b") << "PreferNoSchedule only steers, it does not forbid";
  EXPECT_FALSE(untolerated_taint(json::array({{{"key", "b"}, {"operator", "Exists"}}}), taints));
}

json container(long gpus, const char* where = "limits") {
  return {{"resources", {{where, {{"nvidia.com/gpu", std::to_string(gpus)}}}}}};
}

TEST(AutoscaleScheduling, EffectiveRequestCountsInitContainersAndSidecars) {
  auto spec = [](json containers, json init = json::array()) {
    return json{{"containers", containers}, {"initContainers", init}};
  };
  EXPECT_EQ(effective_request(spec({container(1), container(1)}), "nvidia.com/gpu"), 2)
      << "containers add up (the old code took only the first... no: it summed limits too)";
  EXPECT_EQ(effective_request(spec({container(1)}, {container(3)}), "nvidia.com/gpu"), 3)
      << "an init container needing more than the containers sets the request";
  json sidecar = container(1);
  sidecar["restartPolicy"] = "Always";
  EXPECT_EQ(effective_request(spec({container(1)}, {sidecar}), "nvidia.com/gpu"), 2)
      << "a sidecar runs beside the containers";
  EXPECT_EQ(effective_request(spec({container(1)}, {sidecar, container(2)}), "nvidia.com/gpu"), 3)
      << "an init container after a sidecar runs beside it: 2 + 1";
  EXPECT_EQ(effective_request(spec({container(1)}, {container(2), sidecar}), "nvidia.com/gpu"), 2)
      << "an init container before the sidecar: max(2, 1 + 1)";
  json both = {{"resources",
                {{"requests", {{"nvidia.com/gpu", "2"}}}, {"limits", {{"nvidia.com/gpu", "2"}}}}}};
  EXPECT_EQ(effective_request(spec({both, container(1, "requests")}), "nvidia.com/gpu"), 3);
  json with_overhead = spec({container(1)});
  with_overhead["overhead"] = {{"nvidia.com/gpu", "1"}};
  EXPECT_EQ(effective_request(with_overhead, "nvidia.com/gpu"), 2) << "spec.overhead adds";
  EXPECT_EQ(effective_request(json::object(), "nvidia.com/gpu"), 0);
}

TEST(AutoscaleScheduling, LabelSelectors) {
  json labels = {{"app", "ds"}, {"tier", "gpu"}};
  EXPECT_TRUE(selector_matches({{"matchLabels", {{"app", "ds"}}}}, labels));
  EXPECT_FALSE(selector_matches({{"matchLabels", {{"app", "other"}}}}, labels));
  EXPECT_TRUE(selector_matches(json::object(), labels)) << "empty selects everything";
  auto expr = [](const char* key, const char* op, json values = json::array()) {
    return json{{"matchExpressions", {{{"key", key}, {"operator", op}, {"values", values}}}}};
  };
  EXPECT_TRUE(selector_matches(expr("tier", "In", {"gpu", "cpu"}), labels));
  EXPECT_FALSE(selector_matches(expr("tier", "NotIn", {"gpu"}), labels));
  EXPECT_TRUE(selector_matches(expr("zone", "NotIn", {"a"}), labels)) << "absent is not in";
  EXPECT_TRUE(selector_matches(expr("app", "Exists"), labels));
  EXPECT_FALSE(selector_matches(expr("app", "DoesNotExist"), labels));
  EXPECT_FALSE(selector_matches(expr("app", "Matches"), labels)) << "unknown operator";
}

json gpu_node(const std::string& name, long gpus, json extra_spec = json::object(),
              const char* ready = "True") {
  json spec = extra_spec;
  return {{"metadata", {{"name", name}, {"labels", {{"gpu", "true"}}}}},
          {"spec", spec},
          {"status",
           {{"allocatable", {{"nvidia.com/gpu", std::to_string(gpus)}}},
            {"conditions", {{{"type", "Ready"}, {"status", ready}}}}}}};
}

json pod(const std::string& name, const std::string& node, long gpus, const char* phase = "Running",
         json labels = {{"app", "ds"}}) {
  return {{"metadata", {{"name", name}, {"namespace", "video"}, {"labels", labels}}},
          {"spec", {{"nodeName", node}, {"containers", {container(gpus)}}}},
          {"status", {{"phase", phase}}}};
}

json deployment(long replicas, long gpus_per_container, json pod_spec_extra = json::object()) {
  json pod_spec = {{"containers", {container(gpus_per_container)}}};
  for (const auto& [k, v] : pod_spec_extra.items()) pod_spec[k] = v;
  return {{"apiVersion", "apps/v1"},
          {"kind", "Deployment"},
          {"metadata", {{"name", "deepstream"}, {"namespace", "video"}, {"uid", "uid-1"}}},
          {"spec",
           {{"replicas", replicas},
            {"selector", {{"matchLabels", {{"app", "ds"}}}}},
            {"template", {{"metadata", {{"labels", {{"app", "ds"}}}}}, {"spec", pod_spec}}}}}};
}

TEST(AutoscaleScheduling, GpusPerPodComeFromTheTemplate) {
  json two = deployment(1, 1);
  two["spec"]["template"]["spec"]["containers"].push_back(container(1));
  auto d = deployment_view(two, "nvidia.com/gpu");
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->pod.gpus, 2);
  EXPECT_EQ(d->replicas, 1);
  json unset = deployment(1, 1);
  unset["spec"].erase("replicas");
  EXPECT_EQ(deployment_view(unset, "nvidia.com/gpu")->replicas, 1) << "apps/v1 default";
  auto none = deployment_view(deployment(1, 0), "nvidia.com/gpu");
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("requests no nvidia.com/gpu"), std::string::npos)
      << none.error().message;
}

TEST(AutoscaleScheduling, OnlyNodesANewPodCanLandOnCount) {
  json tolerating = deployment(0, 1,
                               {{"tolerations",
                                 {{{"key", "dedicated"},
                                   {"operator", "Equal"},
                                   {"value", "video"},
                                   {"effect", "NoSchedule"}}}}});
  auto d = deployment_view(tolerating, "nvidia.com/gpu").value();
  std::vector<json> nodes = {
      gpu_node("ok", 1),
      gpu_node("cordoned", 1, {{"unschedulable", true}}),
      gpu_node("not-ready", 1, json::object(), "False"),
      gpu_node("tainted", 1, {{"taints", {{{"key", "maint"}, {"effect", "NoExecute"}}}}}),
      gpu_node(
          "tolerated", 1,
          {{"taints", {{{"key", "dedicated"}, {"value", "video"}, {"effect", "NoSchedule"}}}}}),
      gpu_node("preferred", 1, {{"taints", {{{"key", "x"}, {"effect", "PreferNoSchedule"}}}}}),
  };
  json no_conditions = gpu_node("unknown", 1);
  no_conditions["status"].erase("conditions");
  nodes.push_back(no_conditions);
  auto c = free_capacity(nodes, {}, d, "nvidia.com/gpu");
  EXPECT_EQ(c.free_gpus, 3) << "ok, tolerated, preferred; the old code counted all 7";
  EXPECT_EQ(c.schedulable_nodes, 3);
  ASSERT_EQ(c.skipped.size(), 4u);
  EXPECT_EQ(c.skipped[0], "cordoned: cordoned (spec.unschedulable)");
  EXPECT_EQ(c.skipped[1], "not-ready: not Ready (False)");
  EXPECT_EQ(c.skipped[2], "tainted: taint maint:NoExecute not tolerated");
  EXPECT_EQ(c.skipped[3], "unknown: not Ready (Unknown)");

  json selecting = deployment(0, 1, {{"nodeSelector", {{"zone", "a"}}}});
  auto sel = deployment_view(selecting, "nvidia.com/gpu").value();
  json in_zone = gpu_node("in-zone", 1);
  in_zone["metadata"]["labels"]["zone"] = "a";
  auto z = free_capacity({in_zone, gpu_node("elsewhere", 1)}, {}, sel, "nvidia.com/gpu");
  EXPECT_EQ(z.free_gpus, 1) << "the template's nodeSelector";
}

TEST(AutoscaleScheduling, WholePodsPendingPodsAndReplicasNotYetCreated) {
  auto two_gpu = deployment_view(deployment(0, 2), "nvidia.com/gpu").value();
  auto frag = free_capacity({gpu_node("a", 2), gpu_node("b", 2)},
                            {pod("x", "a", 1, "Running", {{"app", "other"}}),
                             pod("y", "b", 1, "Running", {{"app", "other"}})},
                            two_gpu, "nvidia.com/gpu");
  EXPECT_EQ(frag.free_gpus, 0) << "2 GPUs free, but on two nodes: no 2-GPU pod fits";

  // The Deployment asked for 3, one pod exists, one is terminating: 2 are still to be created.
  auto d = deployment_view(deployment(3, 1), "nvidia.com/gpu").value();
  json leaving = pod("old", "a", 1);
  leaving["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z";
  auto c = free_capacity({gpu_node("a", 4), gpu_node("b", 4)},
                         {pod("ds-1", "a", 1), leaving, pod("pending", "", 1, "Pending"),
                          pod("done", "b", 1, "Succeeded")},
                         d, "nvidia.com/gpu");
  EXPECT_EQ(c.pending_gpus, 1);
  EXPECT_EQ(c.not_created, 1) << "ds-1 and the pending pod exist; 3 asked";
  EXPECT_EQ(c.free_gpus, 8 - 2 - 1 - 1)
      << "8 allocatable, 2 bound on a (the terminating pod still holds its GPU), 1 pending, 1 "
         "not created; the finished pod holds nothing";
}

// --- The controller against a test API server ---

namespace {

const std::string kDeployment = "/apis/apps/v1/namespaces/video/deployments/deepstream";
const std::string kScale = kDeployment + "/scale";
const std::string kEvents = "/apis/events.k8s.io/v1/namespaces/video/events";
const std::string kLease =
    "/apis/coordination.k8s.io/v1/namespaces/video/leases/gpufence-autoscale-deepstream";

class AutoscaleController : public ::testing::Test {
 protected:
  void SetUp() override {
    m_api.apply("/api/v1/nodes", gpu_node("gpu-1", 2));
    m_api.apply("/api/v1/nodes", gpu_node("gpu-2", 2));
    json cpu = gpu_node("cpu-1", 0);
    cpu["metadata"]["labels"] = json::object();
    m_api.apply("/api/v1/nodes", cpu);
    m_api.apply("/api/v1/pods", pod("ds-1", "gpu-1", 1));
    m_api.apply("/api/v1/pods", pod("done", "gpu-1", 1, "Succeeded", json::object()));
    m_api.apply("/api/v1/pods", pod("pending", "", 1, "Pending", json::object()));
    m_api.apply("/api/v1/pods", pod("cpu", "cpu-1", 1, "Running", json::object()));
    m_api.set_versioned(kDeployment, deployment(1, 1));
    m_api.set_versioned(
        kScale,
        {{"kind", "Scale"}, {"metadata", {{"name", "deepstream"}}}, {"spec", {{"replicas", 1}}}});
    m_api.set("/api/v1/namespaces/video/configmaps/streams", 200, R"({"data":{"count":"40"}})");
    auto creds = credentials_from_kubeconfig(m_api.kubeconfig(), "kubeconfig");
    m_kube = make_rest_client(*creds);
    m_opt.ns = "video";
    m_opt.deployment = "deepstream";
    m_opt.streams_per_pod = 8;
    m_opt.node_selector = "gpu=true";
    m_events.instance = "test-instance";
  }
  Result<ReconcileResult> once() {
    return reconcile(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
                     cluster_from_lists(*m_kube, m_opt.node_selector), m_stab,
                     std::chrono::steady_clock::now(), &m_events);
  }
  long replicas() { return m_api.object(kScale)["spec"]["replicas"].get<long>(); }
  void template_gpus(long gpus) {
    auto d = m_api.object(kDeployment);
    d["spec"]["template"]["spec"]["containers"][0] = container(gpus);
    m_api.set_versioned(kDeployment, d);
  }

  test::TestApiServer m_api;
  std::unique_ptr<KubeClient> m_kube;
  AutoscaleOptions m_opt;
  Stabilizer m_stab;
  EventSource m_events{std::string(kAutoscaleEventController), ""};
};

}  // namespace

TEST_F(AutoscaleController, ScalesUpOnlyAsFarAsFreeGpusAllowAndSaysSo) {
  auto r = once();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->streams, 40);
  EXPECT_EQ(r->free_gpus, 2) << "4 allocatable on gpu=true nodes - running - pending";
  EXPECT_EQ(r->desired, 3) << "wants 5; 2 free GPUs add 2 pods";
  EXPECT_TRUE(r->scaled);
  EXPECT_EQ(replicas(), 3);
  auto events = m_api.posted(kEvents);
  ASSERT_EQ(events.size(), 1u) << "one Event per scale decision";
  const auto& e = events[0];
  EXPECT_EQ(e["apiVersion"], "events.k8s.io/v1");
  EXPECT_EQ(e["reason"], "ScaledUp");
  EXPECT_EQ(e["action"], "Scale");
  EXPECT_EQ(e["type"], "Normal");
  EXPECT_EQ(e["reportingController"], "gpufence.io/autoscale");
  EXPECT_EQ(e["reportingInstance"], "test-instance");
  EXPECT_EQ(e["regarding"]["kind"], "Deployment");
  EXPECT_EQ(e["regarding"]["name"], "deepstream");
  EXPECT_EQ(e["regarding"]["uid"], "uid-1");
  EXPECT_NE(e["note"].get<std::string>().find("replicas 1 -> 3"), std::string::npos) << e["note"];
  EXPECT_EQ(e["eventTime"].get<std::string>().size(),
            std::string("2026-12-01T09:00:00.000000Z").size());
  EXPECT_TRUE(e["metadata"]["name"].get<std::string>().starts_with("deepstream."))
      << e["metadata"];
  EXPECT_FALSE(e["metadata"].contains("generateName")) << e["metadata"];
  EXPECT_EQ(m_api.rejected(), 0);
}

TEST_F(AutoscaleController, CordonedAndTaintedNodesAddNoCapacity) {
  m_api.apply("/api/v1/nodes", gpu_node("gpu-2", 2, {{"unschedulable", true}}));
  auto r = once();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->free_gpus, 0) << "gpu-1 has 1 free, the pending pod takes it; gpu-2 is cordoned";
  EXPECT_EQ(r->desired, 1);
  EXPECT_FALSE(r->scaled);
  EXPECT_TRUE(m_api.posted(kEvents).empty()) << "no scale, no Event";
  m_api.apply(
      "/api/v1/nodes",
      gpu_node("gpu-2", 2, {{"taints", {{{"key", "nvidia.com/gpu"}, {"effect", "NoSchedule"}}}}}));
  EXPECT_EQ(once()->free_gpus, 0) << "untolerated taint";
  auto d = m_api.object(kDeployment);
  d["spec"]["template"]["spec"]["tolerations"] = {
      {{"key", "nvidia.com/gpu"}, {"operator", "Exists"}}};
  m_api.set_versioned(kDeployment, d);
  EXPECT_EQ(once()->free_gpus, 2) << "tolerated by the template";
}

TEST_F(AutoscaleController, GpusPerPodAndMissingReplicasFromTheDeployment) {
  template_gpus(2);
  auto r = once();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->gpus_per_pod, 2);
  // gpu-1: 1 free (no 2-GPU pod fits); gpu-2: 2 free = one pod; the 1-GPU pending pod takes 1.
  EXPECT_EQ(r->free_gpus, 1);
  EXPECT_EQ(r->desired, 1) << "1 free GPU is no room for a 2-GPU pod";
  template_gpus(1);
  auto d = m_api.object(kDeployment);
  d["spec"]["replicas"] = 3;  // asked for 3; the ReplicaSet has not created 2 of them yet
  m_api.set_versioned(kDeployment, d);
  auto later = once();
  ASSERT_TRUE(later) << later.error().message;
  EXPECT_EQ(later->capacity.not_created, 2);
  EXPECT_EQ(later->free_gpus, 0) << "the 2 pods on their way take the 2 free GPUs";
}

TEST_F(AutoscaleController, AConflictIsReReadAndRetried) {
  m_api.race_next_put();
  auto r = once();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->scaled);
  EXPECT_EQ(m_api.puts(), 2) << "409 first, then the re-read write";
  EXPECT_EQ(replicas(), 3);
}

TEST_F(AutoscaleController, ServerErrorsChangeNothing) {
  m_api.fail_next_put(503);
  auto r = once();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("HTTP 503"), std::string::npos) << r.error().message;
  EXPECT_EQ(replicas(), 1);
  m_api.set("/api/v1/pods", 500, R"({"kind":"Status","message":"boom","code":500})");
  auto r2 = once();
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message.find("free GPU capacity"), std::string::npos);
  EXPECT_EQ(replicas(), 1);
  m_api.clear("/api/v1/pods");
  m_api.set(kEvents, 403, R"({"kind":"Status","message":"forbidden","code":403})");
  auto r3 = once();
  ASSERT_TRUE(r3) << "an Event that cannot be written does not undo the scale";
  EXPECT_TRUE(r3->scaled);
  EXPECT_NE(r3->event_error.find("HTTP 403"), std::string::npos) << r3->event_error;
}

TEST_F(AutoscaleController, BadDemandChangesNothing) {
  m_api.set("/api/v1/namespaces/video/configmaps/streams", 200, R"({"data":{"count":"lots"}})");
  auto r = once();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("'lots' is not a stream count"), std::string::npos);
  EXPECT_EQ(m_api.puts(), 0);
}

TEST_F(AutoscaleController, DryRunWritesNothing) {
  m_opt.dry_run = true;
  auto r = once();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->desired, 3);
  EXPECT_FALSE(r->scaled);
  EXPECT_EQ(m_api.puts(), 0);
  EXPECT_TRUE(m_api.posted(kEvents).empty());
}

TEST_F(AutoscaleController, ListsArePagedAndFieldSelected) {
  for (int i = 0; i < 700; ++i)
    m_api.apply("/api/v1/pods",
                pod("other-" + std::to_string(i), "cpu-1", 0, "Running", json::object()));
  auto view = cluster_from_lists(*m_kube, "gpu=true")();
  ASSERT_TRUE(view) << view.error().message;
  EXPECT_EQ(view->pods.size(), 703u) << "every page, and no Succeeded pod";
  int pod_pages = 0;
  for (const auto& r : m_api.requests()) {
    if (r.starts_with("GET /api/v1/pods?")) {
      ++pod_pages;
      EXPECT_NE(r.find("limit=500"), std::string::npos) << r;
      EXPECT_NE(r.find("fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed"),
                std::string::npos)
          << r;
    }
  }
  EXPECT_EQ(pod_pages, 2);
}

// The watch: a period costs no list; changes arrive as events; 410 makes it list again.
TEST_F(AutoscaleController, WatchKeepsTheCopyWithoutRelisting) {
  ClusterWatch watch(*m_kube, "gpu=true");
  ASSERT_TRUE(watch.start());
  auto source = watch.source();
  for (int i = 0; i < 3; ++i) {
    auto r = reconcile(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
                       source, m_stab, std::chrono::steady_clock::now());
    ASSERT_TRUE(r) << r.error().message;
  }
  EXPECT_EQ(m_api.lists("/api/v1/pods"), 1) << "three reconciles, one list";
  EXPECT_EQ(m_api.lists("/api/v1/nodes"), 1);
  // A new pod lands on gpu-2; the finished pod leaves the field selector (DELETED to the watch).
  m_api.apply("/api/v1/pods", pod("ds-2", "gpu-2", 2));
  ASSERT_TRUE(watch.pods().wait_for(
      [](const std::vector<json>& pods) {
        for (const auto& p : pods)
          if (p["metadata"]["name"] == "ds-2") return true;
        return false;
      },
      10s));
  m_api.apply("/api/v1/pods", pod("ds-1", "gpu-1", 1, "Succeeded"));
  ASSERT_TRUE(watch.pods().wait_for(
      [](const std::vector<json>& pods) {
        for (const auto& p : pods)
          if (p["metadata"]["name"] == "ds-1") return false;
        return true;
      },
      10s))
      << "a pod that finished leaves the copy";
  auto view = source();
  ASSERT_TRUE(view);
  auto d = deployment_view(deployment(1, 1), "nvidia.com/gpu").value();
  EXPECT_EQ(free_capacity(view->nodes, view->pods, d, "nvidia.com/gpu").free_gpus, 1)
      << "gpu-1: 2 free now ds-1 is gone; gpu-2: 0 (ds-2 took both); the pending pod takes 1";
  EXPECT_EQ(m_api.lists("/api/v1/pods"), 1) << "still no second list";
  EXPECT_GE(m_api.watches("/api/v1/pods"), 1);
  for (const auto& r : m_api.requests()) {
    if (r.starts_with("GET /api/v1/pods?") && r.find("watch=1") != std::string::npos) {
      EXPECT_NE(r.find("allowWatchBookmarks=true"), std::string::npos) << r;
      EXPECT_NE(r.find("resourceVersion="), std::string::npos) << r;
    }
  }
  watch.stop();
}

TEST_F(AutoscaleController, GoneMeansListAgainAndBookmarksMoveTheVersion) {
  WatchCache pods(*m_kube, "/api/v1/pods", WatchOptions{"", kLivePods, 2, 300s, project_pod});
  ASSERT_TRUE(pods.relist());
  EXPECT_EQ(m_api.lists("/api/v1/pods"), 2) << "3 live pods, pages of 2";
  EXPECT_EQ(pods.items()->size(), 3u);
  std::atomic<bool> stop{false};
  // A bookmark, then the server ends the watch: the next watch resumes from the bookmark.
  std::thread t([&] { (void)pods.watch_once(stop); });
  while (m_api.open_watches() == 0) std::this_thread::sleep_for(10ms);
  m_api.apply("/api/v1/nodes", gpu_node("gpu-9", 1));  // moves the global version on
  m_api.bookmark();
  // Waits for the watch thread to apply the bookmark (a wait, not a timing assertion).
  for (int i = 0; i < 1000 && pods.resource_version() != m_api.resource_version(); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(pods.resource_version(), m_api.resource_version());
  m_api.end_watches();
  t.join();
  EXPECT_EQ(pods.stats().bookmarks, 1);
  // History compacted while no watch was open, and a pod changed meanwhile: the watch from the
  // old version gets 410, the copy is dropped, and the next sync lists again and sees the pod.
  m_api.apply("/api/v1/pods", pod("ds-3", "gpu-2", 1));
  m_api.compact();
  auto gone = pods.sync(stop);
  ASSERT_TRUE(gone) << gone.error().message;
  EXPECT_EQ(pods.stats().gone, 1);
  EXPECT_FALSE(pods.items()) << "not synced between the 410 and the list";
  auto listed = pods.sync(stop);
  ASSERT_TRUE(listed) << listed.error().message;
  EXPECT_EQ(m_api.lists("/api/v1/pods"), 4) << "a second list (two pages)";
  EXPECT_EQ(pods.items()->size(), 4u);
}

// Projected service-account tokens rotate: the client must read the new one.
TEST_F(AutoscaleController, TheTokenFileIsReadAgainWhenItChanges) {
  test::TempDir dir;
  auto token = dir.write("token", "first\n");
  auto cfg = m_api.kubeconfig();
  cfg.replace(cfg.find("token: test-token"), std::string("token: test-token").size(),
              "tokenFile: " + token.string());
  auto creds = credentials_from_kubeconfig(cfg, "kubeconfig");
  ASSERT_TRUE(creds) << creds.error().message;
  auto kube = make_rest_client(*creds);
  m_api.require_token("first");
  ASSERT_TRUE(kube->get(kDeployment)) << "the first token";
  ASSERT_TRUE(write_file_atomic(token, "second\n"));  // a new inode, as the kubelet's swap makes
  m_api.require_token("second");
  auto after = kube->get(kDeployment);
  EXPECT_TRUE(after) << "the rotated token was not read: " << (after ? "" : after.error().message);
  EXPECT_EQ(m_api.unauthorized(), 0) << "read before the request, not after a 401";
}

// Two replicas against one API server: only the Lease holder scales.
TEST_F(AutoscaleController, OnlyTheLeaseHolderScales) {
  auto make = [&](const std::string& id) {
    LeaseOptions lease{"video", "gpufence-autoscale-deepstream", id, 30s};
    return std::make_unique<Controller>(*m_kube, m_opt,
                                        streams_from_configmap(*m_kube, "video/streams:count"),
                                        cluster_from_lists(*m_kube, m_opt.node_selector),
                                        EventSource{"gpufence.io/autoscale", id}, lease);
  };
  auto a = make("a"), b = make("b");
  auto t0 = std::chrono::steady_clock::now();
  auto sa = a->step(t0);
  ASSERT_FALSE(sa.error) << sa.error->message;
  EXPECT_TRUE(sa.leader);
  ASSERT_TRUE(sa.result);
  EXPECT_TRUE(sa.result->scaled);
  EXPECT_EQ(m_api.object(kLease)["spec"]["holderIdentity"], "a");
  int puts = m_api.puts();
  auto sb = b->step(t0);
  EXPECT_FALSE(sb.error);
  EXPECT_FALSE(sb.leader);
  EXPECT_EQ(sb.holder, "a");
  EXPECT_FALSE(sb.result) << "the standby reconciles nothing";
  EXPECT_EQ(m_api.puts(), puts) << "and writes nothing";
  // a renews; b's clock starts over whenever the record changes.
  EXPECT_TRUE(a->step(t0 + 10s).leader);
  EXPECT_FALSE(b->step(t0 + 35s).leader) << "renewed 25 s ago by b's clock";
  // a stops renewing (crashed): after the lease duration without a change, b takes over.
  EXPECT_FALSE(b->step(t0 + 60s).leader) << "b saw the renewal at 35 s";
  auto taken = b->step(t0 + 66s);
  EXPECT_TRUE(taken.leader);
  EXPECT_EQ(m_api.object(kLease)["spec"]["holderIdentity"], "b");
  EXPECT_EQ(m_api.object(kLease)["spec"]["leaseTransitions"], 1);
  EXPECT_EQ(taken.result->reason.empty(), false);
  // a comes back: it sees b's fresh record and stands by.
  EXPECT_FALSE(a->step(t0 + 67s).leader);
  // b shuts down and releases; a takes over at once.
  ASSERT_TRUE(b->shutdown());
  EXPECT_TRUE(a->step(t0 + 68s).leader) << "a released Lease is free at once";
}

TEST_F(AutoscaleController, TwoReplicasRacingForAnExpiredLeaseOneWins) {
  LeaseOptions la{"video", "l", "a", 30s}, lb{"video", "l", "b", 30s};
  LeaderElector a(*m_kube, la), b(*m_kube, lb);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(a.try_acquire_or_renew(t0).value());
  ASSERT_FALSE(b.try_acquire_or_renew(t0).value());
  // Both see it expired; b's write finds the Lease changed by a (a's renewal lands first).
  m_api.race_next_put();
  EXPECT_FALSE(b.try_acquire_or_renew(t0 + 31s).value()) << "409: a peer wrote first";
}

TEST_F(AutoscaleController, TheBinaryReconcilesOnce) {
  test::TempDir dir;
  auto cfg = dir.write("kubeconfig", m_api.kubeconfig());
  auto streams = dir.write("streams", "16\n");
  auto r = test::run_command({test::bin_path("gpufence"), "autoscale", "--kubeconfig", cfg.string(),
                              "--deployment", "video/deepstream", "--streams-per-pod", "8",
                              "--streams-file", streams.string(), "--node-selector", "gpu=true",
                              "--identity", "cli", "--once"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("replicas 1 -> 2 (scaled)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 per pod"), std::string::npos) << r.out;
  EXPECT_EQ(replicas(), 2);
  ASSERT_TRUE(m_api.has_object(kLease)) << "it elected itself on the Lease";
  EXPECT_EQ(m_api.object(kLease)["spec"]["holderIdentity"], "") << "and released it on exit";
  auto flag = test::run_command({test::bin_path("gpufence"), "autoscale", "--kubeconfig",
                                 cfg.string(), "--deployment", "video/deepstream", "--gpus-per-pod",
                                 "2", "--streams-file", streams.string(), "--once"});
  EXPECT_NE(flag.exit_code, 0) << "--gpus-per-pod is gone: the template says";
}

// The manifest's RBAC allows exactly the calls the autoscaler makes: each request the
// controller sent (list, watch, get, update, create) maps to a rule, and every rule is used.
namespace {

struct Call {
  std::string group, resource, verb, ns, name;  // name: of the object, "" for list/watch/create
  auto operator<=>(const Call&) const = default;
};

Call call_of(const std::string& request) {
  auto sp = request.find(' ');
  std::string method = request.substr(0, sp), target = request.substr(sp + 1);
  bool watch = target.find("watch=1") != std::string::npos;
  std::string path = target.substr(0, target.find('?'));
  std::vector<std::string> parts;
  for (size_t i = 1, j; i <= path.size(); i = j + 1) {
    j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    parts.push_back(path.substr(i, j - i));
  }
  Call c;
  size_t at = 0;
  if (parts[0] == "api") {
    at = 2;
  } else {
    c.group = parts[1];
    at = 3;
  }
  if (parts.size() > at + 1 && parts[at] == "namespaces") {
    c.ns = parts[at + 1];
    at += 2;
  }
  c.resource = parts[at];
  bool named = parts.size() > at + 1;
  if (named) c.name = parts[at + 1];
  if (parts.size() > at + 2) c.resource += "/" + parts[at + 2];
  c.verb = method == "POST"  ? "create"
           : method == "PUT" ? "update"
           : watch           ? "watch"
           : named           ? "get"
                             : "list";
  return c;
}

}  // namespace

TEST_F(AutoscaleController, RbacIsExactlyWhatTheCallsNeed) {
  ClusterWatch watch(*m_kube, "gpu=true");
  ASSERT_TRUE(watch.start());
  LeaseOptions lease{"video", "gpufence-autoscale-deepstream", "a", 30s};
  m_api.set("/api/v1/namespaces/video/configmaps/streams", 200, R"({"data":{"count":"40"}})");
  Controller c(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
               watch.source(), EventSource{"gpufence.io/autoscale", "a"}, lease);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.step(t0).result);       // creates the Lease, scales, records an Event
  ASSERT_TRUE(c.step(t0 + 1s).result);  // renews the Lease (update)
  while (m_api.watches("/api/v1/pods") == 0 || m_api.watches("/api/v1/nodes") == 0)
    std::this_thread::sleep_for(10ms);
  watch.stop();
  std::set<Call> made;
  for (const auto& r : m_api.requests()) made.insert(call_of(r));

  auto doc = YAML::LoadAllFromFile(std::string(GPUFENCE_SOURCE_DIR) +
                                   "/deploy/kubernetes/autoscaler.yaml");
  // One grant per (group, resource, verb) of a rule, with the rule's resourceNames (none: any
  // name); a Role's grants hold in its namespace only. The chart splits them over several Roles.
  struct Grant {
    std::string group, resource, verb, ns;
    std::set<std::string> names;
  };
  std::vector<Grant> allowed;
  for (const auto& d : doc) {
    std::string kind = d["kind"].as<std::string>();
    if (kind != "Role" && kind != "ClusterRole") continue;
    std::string ns = kind == "Role" ? d["metadata"]["namespace"].as<std::string>() : "*";
    for (const auto& rule : d["rules"]) {
      std::set<std::string> names;
      for (const auto& n : rule["resourceNames"]) names.insert(n.as<std::string>());
      for (const auto& g : rule["apiGroups"])
        for (const auto& res : rule["resources"])
          for (const auto& v : rule["verbs"])
            allowed.push_back(
                {g.as<std::string>(), res.as<std::string>(), v.as<std::string>(), ns, names});
    }
  }
  auto grants = [](const Grant& a, const Call& c) {
    return a.group == c.group && a.resource == c.resource && a.verb == c.verb &&
           (a.ns == "*" || a.ns == c.ns) && (a.names.empty() || a.names.contains(c.name));
  };
  for (const auto& m : made)
    EXPECT_TRUE(
        std::any_of(allowed.begin(), allowed.end(), [&](const Grant& a) { return grants(a, m); }))
        << "not allowed by the manifest: " << m.verb << " " << m.group << "/" << m.resource << " '"
        << m.name << "' in '" << m.ns << "'";
  for (const auto& a : allowed)
    EXPECT_TRUE(std::any_of(made.begin(), made.end(), [&](const Call& m) { return grants(a, m); }))
        << "granted but never used: " << a.verb << " " << a.group << "/" << a.resource << " in '"
        << a.ns << "'";
}

TEST_F(AutoscaleController, DemandTheGpusCannotMeetIsOneWarningNotOnePerPeriod) {
  m_api.apply("/api/v1/nodes", gpu_node("gpu-2", 2, {{"unschedulable", true}}));
  Controller c(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
               cluster_from_lists(*m_kube, m_opt.node_selector), m_events, std::nullopt);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    auto s = c.step(t0 + std::chrono::seconds(15 * i));
    ASSERT_TRUE(s.result) << s.error->message;
    EXPECT_TRUE(s.result->capped);
    EXPECT_FALSE(s.result->scaled);
  }
  auto events = m_api.posted(kEvents);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_EQ(events[0]["reason"], "ScaleUpCappedByGpus");
  EXPECT_NE(events[0]["note"].get<std::string>().find("capped at 1 by 0 free GPU(s)"),
            std::string::npos)
      << events[0]["note"];
}

TEST_F(AutoscaleController, AFailedWatchDropsTheCopyRatherThanServeItStale) {
  WatchCache nodes(*m_kube, "/api/v1/nodes", WatchOptions{"gpu=true", "", 500, 300s, project_node});
  ASSERT_TRUE(nodes.relist());
  EXPECT_EQ(nodes.items()->size(), 2u) << "the label selector: gpu-1 and gpu-2";
  m_api.require_token("someone-else");  // e.g. the token was revoked
  std::atomic<bool> stop{false};
  auto st = nodes.watch_once(stop);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("HTTP 401"), std::string::npos) << st.error().message;
  auto items = nodes.items();
  ASSERT_FALSE(items) << "changes may have been missed: no answer beats a stale one";
  EXPECT_NE(items.error().message.find("HTTP 401"), std::string::npos) << items.error().message;
}

TEST_F(AutoscaleController, GoneAsAnHttpStatusAlsoMeansListAgain) {
  WatchCache pods(*m_kube, "/api/v1/pods", WatchOptions{"", kLivePods, 500, 300s, project_pod});
  ASSERT_TRUE(pods.relist());
  m_api.apply("/api/v1/pods", pod("ds-3", "gpu-2", 1));
  m_api.compact();
  m_api.gone_as_http_status(true);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(pods.sync(stop)) << "410 is not a failure: it says what to do";
  EXPECT_EQ(pods.stats().gone, 1);
  ASSERT_TRUE(pods.sync(stop));
  EXPECT_EQ(pods.items()->size(), 4u);
}

// A client that compacts the server's history right after the first page of a list, so the
// continue token the next page carries has expired (410), as after 5 minutes on a real server.
namespace {
class CompactAfterFirstPage final : public KubeClient {
 public:
  CompactAfterFirstPage(KubeClient& inner, test::TestApiServer& api) : m_inner(inner), m_api(api) {}
  Result<KubeResponse> call(const std::string& method, const std::string& path,
                            const std::string& body) override {
    auto r = m_inner.call(method, path, body);
    if (path.find("limit=") != std::string::npos && m_pages++ == 0) {
      m_api.apply("/api/v1/pods", pod("late", "gpu-2", 1));
      m_api.compact();
    }
    return r;
  }
  Result<KubeResponse> stream(const std::string& path, const LineHandler& on_line,
                              const std::atomic<bool>& stop, std::chrono::seconds max) override {
    return m_inner.stream(path, on_line, stop, max);
  }
  int m_pages = 0;

 private:
  KubeClient& m_inner;
  test::TestApiServer& m_api;
};
}  // namespace

TEST_F(AutoscaleController, AnExpiredContinueTokenStartsTheListOver) {
  CompactAfterFirstPage kube(*m_kube, m_api);
  WatchCache pods(kube, "/api/v1/pods", WatchOptions{"", kLivePods, 2, 300s, project_pod});
  auto st = pods.relist();
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(pods.items()->size(), 4u) << "the restarted list has every pod, the late one too";
  EXPECT_EQ(kube.m_pages, 4) << "page 1, the 410, then two pages from the start";
}

// The binary's loop: it elects itself, keeps nodes and pods by watch (one list each however many
// periods), and on SIGTERM releases the Lease and exits 0.
TEST_F(AutoscaleController, TheBinaryLoopsOnTheWatchAndStopsOnSigterm) {
  test::TempDir dir;
  auto cfg = dir.write("kubeconfig", m_api.kubeconfig());
  auto streams = dir.write("streams", "16\n");
  auto out = dir / "out";
  const std::string bin = test::bin_path("gpufence");  // no allocation after fork()
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(bin.c_str(), bin.c_str(), "autoscale", "--kubeconfig", cfg.c_str(), "--deployment",
            "video/deepstream", "--streams-per-pod", "8", "--streams-file", streams.c_str(),
            "--node-selector", "gpu=true", "--identity", "loop", "--period", "1", nullptr);
    ::_exit(127);
  }
  // Wait (not a timing assertion) until it has reconciled a few periods on its watches.
  auto renewals = [&] {
    int n = 0;
    for (const auto& r : m_api.requests()) n += r.starts_with("PUT " + kLease) ? 1 : 0;
    return n;
  };
  for (int i = 0; i < 3000 && (renewals() < 3 || m_api.open_watches() < 2); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_GE(renewals(), 3) << read_file(out).value_or("");
  EXPECT_EQ(m_api.object(kLease)["spec"]["holderIdentity"], "loop");
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << read_file(out).value_or("");
  EXPECT_EQ(WEXITSTATUS(status), 0) << read_file(out).value_or("");
  EXPECT_EQ(m_api.lists("/api/v1/pods"), 1) << "one list over every period";
  EXPECT_EQ(m_api.lists("/api/v1/nodes"), 1);
  EXPECT_EQ(m_api.object(kLease)["spec"]["holderIdentity"], "") << "released on SIGTERM";
  EXPECT_EQ(replicas(), 2);
  EXPECT_NE(read_file(out).value_or("").find("replicas 1 -> 2 (scaled)"), std::string::npos);
}

// --- Demand a tenant cannot fake ---

namespace {

// A Pending pod of another team: any namespace, not the Deployment's labels.
json tenant_pod(const std::string& name, long gpus, json spec_extra = json::object()) {
  json p = pod(name, "", gpus, "Pending", json::object());
  p["metadata"]["namespace"] = "tenant";
  for (const auto& [k, v] : spec_extra.items()) p["spec"][k] = v;
  return p;
}

json affinity(json terms) {
  return {{"nodeAffinity",
           {{"requiredDuringSchedulingIgnoredDuringExecution", {{"nodeSelectorTerms", terms}}}}}};
}

json term(json expressions, json fields = json::array()) {
  json t = json::object();
  if (!expressions.empty()) t["matchExpressions"] = expressions;
  if (!fields.empty()) t["matchFields"] = fields;
  return t;
}

json req(const char* key, const char* op, json values = json::array()) {
  return {{"key", key}, {"operator", op}, {"values", values}};
}

std::vector<json> notes_of(const std::vector<json>& events, const std::string& reason) {
  std::vector<json> out;
  for (const auto& e : events)
    if (e["reason"] == reason) out.push_back(e);
  return out;
}

}  // namespace

TEST(AutoscaleScheduling, RequiredNodeAffinityAsTheSchedulerMatchesIt) {
  json node = gpu_node("gpu-7", 1);
  node["metadata"]["labels"] = {{"zone", "a"}, {"gen", "9"}, {"name", "x"}};
  struct Case {
    json terms;
    bool matches;
    const char* why;
  } cases[] = {
      {{term({req("zone", "In", {"a", "b"})})}, true, "In"},
      {{term({req("zone", "In", {"b"})})}, false, "In, other value"},
      {{term({req("zone", "NotIn", {"b"})})}, true, "NotIn"},
      {{term({req("rack", "NotIn", {"b"})})}, true, "NotIn: an absent label is not in"},
      {{term({req("zone", "Exists")})}, true, "Exists"},
      {{term({req("rack", "DoesNotExist")})}, true, "DoesNotExist"},
      {{term({req("zone", "DoesNotExist")})}, false, "DoesNotExist on a present label"},
      {{term({req("gen", "Gt", {"8"})})}, true, "Gt: 9 > 8"},
      {{term({req("gen", "Gt", {"9"})})}, false, "Gt is strict"},
      {{term({req("gen", "Lt", {"+10"})})}, true, "Lt: ParseInt takes a sign"},
      {{term({req("name", "Gt", {"1"})})}, false, "Gt on a label that is not a number"},
      {{term({req("rack", "Lt", {"1"})})}, false, "Lt on an absent label"},
      {{term({req("zone", "In", {"a"}), req("gen", "Lt", {"5"})})}, false, "expressions are ANDed"},
      {{term({req("zone", "In", {"b"})}), term({req("gen", "Gt", {"1"})})}, true, "terms are ORed"},
      {{term(json::array(), {req("metadata.name", "In", {"gpu-7"})})}, true, "matchFields name"},
      {{term(json::array(), {req("metadata.name", "NotIn", {"gpu-7"})})}, false, "NotIn name"},
      {{term(json::array(), {req("metadata.uid", "In", {"gpu-7"})})},
       false,
       "another field reads as empty"},
      {{term({req("zone", "In", {"a"})}, {req("metadata.name", "In", {"gpu-8"})})},
       false,
       "labels and fields are ANDed"},
      {{json::object()}, false, "an empty term matches nothing"},
      {json::array(), false, "no term matches nothing"},
      // Terms that do not parse match nothing, even where the rest would; others still can.
      {{term({req("zone", "In")})}, false, "In without values"},
      {{term({req("zone", "Exists", {"a"})})}, false, "Exists with values"},
      {{term({req("gen", "Gt", {"8", "9"})})}, false, "Gt needs exactly one value"},
      {{term({req("gen", "Gt", {"eight"})})}, false, "Gt needs an integer"},
      {{term({req("zone", "Matches", {"a"})})}, false, "unknown operator"},
      {{term(json::array(), {req("metadata.name", "In", {"gpu-7", "gpu-8"})})},
       false,
       "matchFields need exactly one value"},
      {{term(json::array(), {req("metadata.name", "Exists")})}, false, "matchFields: In/NotIn"},
      {{term({req("zone", "In")}), term({req("zone", "In", {"a"})})},
       true,
       "a bad term does not spoil a good one"},
  };
  for (const auto& c : cases) {
    json selector = {{"nodeSelectorTerms", c.terms}};
    EXPECT_EQ(node_affinity_matches(selector, node), c.matches) << c.why;
  }
}

TEST(AutoscaleScheduling, ATenantsUnschedulablePendingPodIsNotDemand) {
  auto d = deployment_view(deployment(1, 1), "nvidia.com/gpu").value();
  std::vector<json> nodes = {gpu_node("a", 2), gpu_node("b", 2)};
  const std::vector<json> base = {pod("ds-1", "a", 1)};
  auto free_with = [&](json extra) {
    auto pods = base;
    pods.push_back(extra);
    return free_capacity(nodes, pods, d, "nvidia.com/gpu");
  };
  EXPECT_EQ(free_capacity(nodes, base, d, "nvidia.com/gpu").free_gpus, 3);
  struct Case {
    json pod;
    const char* kind;
  } cases[] = {
      {tenant_pod("huge", 64), "request"},
      {tenant_pod("nowhere", 2, {{"nodeSelector", {{"zone", "nowhere"}}}}), "nodeSelector"},
      {tenant_pod("pinned", 2,
                  {{"affinity",
                    affinity({term(json::array(), {req("metadata.name", "In", {"cpu-1"})})})}}),
       "nodeAffinity"},
      {tenant_pod("zoned", 2, {{"affinity", affinity({term({req("zone", "In", {"x"})})})}}),
       "nodeAffinity"},
  };
  for (const auto& c : cases) {
    auto cap = free_with(c.pod);
    EXPECT_EQ(cap.free_gpus, 3) << c.pod["metadata"]["name"] << ": the old code read 0 or 1";
    EXPECT_EQ(cap.pending_gpus, 0);
    ASSERT_EQ(cap.ignored.size(), 1u) << c.pod["metadata"]["name"];
    EXPECT_EQ(cap.ignored[0].object, "pod tenant/" + c.pod["metadata"]["name"].get<std::string>());
    EXPECT_EQ(cap.ignored[0].kind, c.kind);
  }
  // Taints: both nodes are dedicated to video; the Deployment tolerates that, the tenant not.
  json tainted = {
      {"taints", {{{"key", "dedicated"}, {"value", "video"}, {"effect", "NoSchedule"}}}}};
  json tolerate = {{"tolerations", {{{"key", "dedicated"}, {"operator", "Exists"}}}}};
  auto dt = deployment_view(deployment(1, 1, tolerate), "nvidia.com/gpu").value();
  std::vector<json> dedicated = {gpu_node("a", 2, tainted), gpu_node("b", 2, tainted)};
  auto t = free_capacity(dedicated, {pod("ds-1", "a", 1), tenant_pod("untolerated", 2)}, dt,
                         "nvidia.com/gpu");
  EXPECT_EQ(t.free_gpus, 3) << "the old code read 1";
  ASSERT_EQ(t.ignored.size(), 1u);
  EXPECT_EQ(t.ignored[0].kind, "taint");
  EXPECT_NE(t.ignored[0].why.find("a: taint dedicated=video:NoSchedule not tolerated"),
            std::string::npos)
      << t.ignored[0].why;
  json no_execute = {{"taints", {{{"key", "dedicated"}, {"effect", "NoExecute"}}}}};
  auto ne = free_capacity(
      {gpu_node("a", 2, no_execute)},
      {tenant_pod("untolerated", 1,
                  {{"tolerations",
                    {{{"key", "dedicated"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}}}})},
      deployment_view(deployment(0, 1, tolerate), "nvidia.com/gpu").value(), "nvidia.com/gpu");
  EXPECT_EQ(ne.free_gpus, 2) << "NoSchedule tolerated is not NoExecute tolerated";

  // Controls: a pending pod that can land on one of the nodes is demand, whatever its namespace.
  json fits =
      tenant_pod("fits", 2,
                 {{"nodeSelector", {{"gpu", "true"}}},
                  {"affinity",
                   affinity({term({req("gpu", "Exists")}, {req("metadata.name", "In", {"b"})})})}});
  auto f = free_with(fits);
  EXPECT_EQ(f.free_gpus, 1) << "2 of the 3 free GPUs are on their way to it";
  EXPECT_EQ(f.pending_gpus, 2);
  EXPECT_TRUE(f.ignored.empty());
  auto tolerated =
      free_capacity(dedicated, {pod("ds-1", "a", 1), tenant_pod("tolerating", 2, tolerate)}, dt,
                    "nvidia.com/gpu");
  EXPECT_EQ(tolerated.free_gpus, 1);
  EXPECT_EQ(free_with(tenant_pod("exactly", 2)).free_gpus, 1)
      << "a request equal to a node's allocatable fits";
}

TEST(AutoscaleArithmetic, RequestsOfInt64MaxSaturate) {
  const std::string max = "9223372036854775807";
  json big = {{"resources", {{"limits", {{"nvidia.com/gpu", max}}}}}};
  json spec = {{"containers", {big, big}},
               {"initContainers", {big}},
               {"overhead", {{"nvidia.com/gpu", max}}}};
  EXPECT_EQ(effective_request(spec, "nvidia.com/gpu"), std::numeric_limits<long>::max());

  auto d = deployment_view(deployment(1, 1), "nvidia.com/gpu").value();
  // Two Pending pods of INT64_MAX each turned 1 free GPU into 3.
  json p1 = pod("big-1", "", 0, "Pending", json::object());
  p1["spec"]["containers"] = {big};
  json p2 = p1;
  p2["metadata"]["name"] = "big-2";
  auto c = free_capacity({gpu_node("a", 2)}, {pod("ds-1", "a", 1), p1, p2}, d, "nvidia.com/gpu");
  EXPECT_EQ(c.free_gpus, 1);
  EXPECT_EQ(c.ignored.size(), 2u) << "larger than any node: not demand";
  // Bound to a node directly (spec.nodeName skips the scheduler): they hold the node, and the
  // sum does not wrap into free GPUs.
  json b1 = p1, b2 = p2;
  b1["spec"]["nodeName"] = b2["spec"]["nodeName"] = "a";
  auto none_asked = deployment_view(deployment(0, 1), "nvidia.com/gpu").value();
  auto bound =
      free_capacity({gpu_node("a", 2), gpu_node("b", 1)}, {b1, b2}, none_asked, "nvidia.com/gpu");
  EXPECT_EQ(bound.free_gpus, 1) << "a is full, b has 1";
  // A Deployment asking for LONG_MAX replicas.
  auto many = deployment_view(deployment(std::numeric_limits<long>::max(), 1), "nvidia.com/gpu");
  auto m = free_capacity({gpu_node("a", 2)}, {}, *many, "nvidia.com/gpu");
  EXPECT_EQ(m.free_gpus, 0);
  EXPECT_EQ(m.not_created, std::numeric_limits<long>::max());
}

TEST(AutoscaleArithmetic, AStreamCountOfInt64MaxDoesNotScaleToZero) {
  const long max = std::numeric_limits<long>::max();
  auto r = recommend({max, 4, 1, 0, 10, 1, 5});
  EXPECT_EQ(r.replicas, 6) << "wants the maximum 10, 5 free GPUs add 5; the old code said 0";
  EXPECT_TRUE(r.capped_by_gpus);
  EXPECT_EQ(recommend({max, 1, 1, 0, max, 1, max}).replicas, max);
  EXPECT_EQ(recommend({max - 1, max, 1, 0, 10, 1, 5}).replicas, 1) << "ceil((max-1)/max) = 1";
  EXPECT_EQ(recommend({max, 1, max - 1, 0, max, 1, max}).replicas, max)
      << "current + free saturate";
  Stabilizer st;
  EXPECT_EQ(st.stabilize(max, max - 1, std::chrono::steady_clock::now()), max)
      << "current + step saturates";
}

TEST(AutoscaleQuantities, CountsAsKubernetesWritesThem) {
  auto d = deployment_view(deployment(0, 1), "nvidia.com/gpu").value();
  json k = gpu_node("k", 0), e = gpu_node("e", 0), milli = gpu_node("m", 0);
  k["status"]["allocatable"]["nvidia.com/gpu"] = "1k";
  e["status"]["allocatable"]["nvidia.com/gpu"] = "1e3";
  milli["status"]["allocatable"]["nvidia.com/gpu"] = "2000m";
  auto c = free_capacity({k, e, milli}, {}, d, "nvidia.com/gpu");
  EXPECT_EQ(c.free_gpus, 2002) << "the old reader said 0 for each";
  EXPECT_TRUE(c.unreadable.empty());

  json half = gpu_node("half", 0);
  half["status"]["allocatable"]["nvidia.com/gpu"] = "500m";
  json junk = gpu_node("junk", 0);
  junk["status"]["allocatable"]["nvidia.com/gpu"] = "lots";
  auto bad = free_capacity({half, junk, gpu_node("ok", 1)}, {}, d, "nvidia.com/gpu");
  EXPECT_EQ(bad.free_gpus, 1);
  ASSERT_EQ(bad.unreadable.size(), 2u);
  EXPECT_EQ(bad.unreadable[0].object, "node half");
  EXPECT_NE(bad.unreadable[0].why.find("not a whole number"), std::string::npos)
      << bad.unreadable[0].why;
  EXPECT_EQ(bad.unreadable[1].object, "node junk");
  EXPECT_NE(bad.unreadable[1].why.find("'lots'"), std::string::npos) << bad.unreadable[1].why;

  // A bound pod whose request does not parse: its node's GPUs count as taken, and it is named.
  json odd = pod("odd", "a", 0, "Running", json::object());
  odd["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5.5";
  auto p = free_capacity({gpu_node("a", 4), gpu_node("b", 1)}, {odd}, d, "nvidia.com/gpu");
  EXPECT_EQ(p.free_gpus, 1) << "a counts as full, not as 4 free (the old reader: 0 requested)";
  ASSERT_EQ(p.unreadable.size(), 1u);
  EXPECT_EQ(p.unreadable[0].object, "pod video/odd");

  json template_half = deployment(1, 1);
  template_half["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
               ["nvidia.com/gpu"] = "500m";
  auto t = deployment_view(template_half, "nvidia.com/gpu");
  ASSERT_FALSE(t) << "the old reader took 500m as 0 GPUs";
  EXPECT_NE(t.error().message.find("video/deepstream"), std::string::npos) << t.error().message;
}

TEST_F(AutoscaleController, ATenantsUnschedulablePodDoesNotFreezeScaleUpAndIsNamedOnce) {
  // Fixture: 4 GPUs on gpu=true nodes, 1 running, 1 pending that fits: 2 free, 40 streams want 5.
  struct Case {
    json pod;
    const char* kind;
  } cases[] = {
      {tenant_pod("blocker", 64), "request"},
      {tenant_pod("blocker", 2, {{"nodeSelector", {{"zone", "nowhere"}}}}), "nodeSelector"},
      {tenant_pod("blocker", 2, {{"affinity", affinity({term({req("gpu", "DoesNotExist")})})}}),
       "nodeAffinity"},
  };
  size_t named_before = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.kind);
    m_api.apply("/api/v1/pods", c.pod);
    m_api.set_versioned(
        kScale,
        {{"kind", "Scale"}, {"metadata", {{"name", "deepstream"}}}, {"spec", {{"replicas", 1}}}});
    Controller ctl(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
                   cluster_from_lists(*m_kube, m_opt.node_selector), m_events, std::nullopt);
    auto t0 = std::chrono::steady_clock::now();
    auto s = ctl.step(t0);
    ASSERT_TRUE(s.result) << s.error->message;
    EXPECT_EQ(s.result->free_gpus, 2) << "the old code read 0 and froze";
    EXPECT_EQ(s.result->desired, 3);
    EXPECT_EQ(replicas(), 3);
    ASSERT_TRUE(ctl.step(t0 + 15s).result);
    auto named = notes_of(m_api.posted(kEvents), "PendingPodNotCounted");
    ASSERT_EQ(named.size(), named_before + 1) << "one Event per pod and reason, not per period";
    named_before = named.size();
    const json& e = named.back();
    EXPECT_EQ(e["type"], "Normal");
    EXPECT_EQ(e["regarding"]["name"], "deepstream");
    EXPECT_NE(e["note"].get<std::string>().find("pod tenant/blocker: requests"), std::string::npos)
        << e["note"];
  }
}

TEST_F(AutoscaleController, ATaintedPoolKeepsATenantsPodOutOfTheDemand) {
  json tainted = {
      {"taints", {{{"key", "dedicated"}, {"value", "video"}, {"effect", "NoExecute"}}}}};
  m_api.apply("/api/v1/nodes", gpu_node("gpu-1", 2, tainted));
  m_api.apply("/api/v1/nodes", gpu_node("gpu-2", 2, tainted));
  auto d = m_api.object(kDeployment);
  d["spec"]["template"]["spec"]["tolerations"] = {{{"key", "dedicated"}, {"operator", "Exists"}}};
  m_api.set_versioned(kDeployment, d);
  m_api.apply("/api/v1/pods", tenant_pod("blocker", 2));
  Controller ctl(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
                 cluster_from_lists(*m_kube, m_opt.node_selector), m_events, std::nullopt);
  auto s = ctl.step(std::chrono::steady_clock::now());
  ASSERT_TRUE(s.result) << s.error->message;
  EXPECT_EQ(s.result->free_gpus, 3) << "the fixture's pending pod cannot land either; old: 0";
  EXPECT_EQ(s.result->desired, 4);
  auto named = notes_of(m_api.posted(kEvents), "PendingPodNotCounted");
  ASSERT_EQ(named.size(), 2u);
  for (const auto& e : named)
    EXPECT_NE(e["note"].get<std::string>().find("taint dedicated=video:NoExecute not tolerated"),
              std::string::npos)
        << e["note"];
}

TEST_F(AutoscaleController, OverflowingQuantitiesAndStreamsDoNotScaleWrong) {
  // Two Pending pods of INT64_MAX GPUs: 1 free GPU became 3 (it scaled 1 -> 4).
  m_api.apply("/api/v1/nodes", gpu_node("gpu-2", 2, {{"unschedulable", true}}));
  json big = tenant_pod("big-1", 0);
  big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9223372036854775807";
  m_api.apply("/api/v1/pods", big);
  big["metadata"]["name"] = "big-2";
  m_api.apply("/api/v1/pods", big);
  m_api.remove("/api/v1/pods", "video", "pending");
  auto r = once();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->free_gpus, 1) << "gpu-1: 2 - 1 running";
  EXPECT_EQ(r->desired, 2);
  // A stream count of INT64_MAX scaled to 0.
  m_api.set("/api/v1/namespaces/video/configmaps/streams", 200,
            R"({"data":{"count":"9223372036854775807"}})");
  m_stab = Stabilizer();  // no earlier recommendation to hold a scale-down
  auto s = once();
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_GE(s->desired, s->current) << "the old code scaled to 0";
  EXPECT_GT(replicas(), 0);
}

TEST_F(AutoscaleController, AnUnreadableQuantityIsAWarningNamingThePod) {
  json odd = tenant_pod("odd", 0);
  odd["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "lots";
  m_api.apply("/api/v1/pods", odd);
  Controller ctl(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
                 cluster_from_lists(*m_kube, m_opt.node_selector), m_events, std::nullopt);
  auto s = ctl.step(std::chrono::steady_clock::now());
  ASSERT_TRUE(s.result) << s.error->message;
  ASSERT_EQ(s.result->capacity.unreadable.size(), 1u);
  auto warned = notes_of(m_api.posted(kEvents), "UnreadableQuantity");
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_EQ(warned[0]["type"], "Warning");
  EXPECT_NE(warned[0]["note"].get<std::string>().find("pod tenant/odd"), std::string::npos)
      << warned[0]["note"];
  EXPECT_NE(warned[0]["note"].get<std::string>().find("'lots'"), std::string::npos)
      << warned[0]["note"];
  // The Deployment's own template: the reconcile stops, naming it, and writes nothing.
  auto d = m_api.object(kDeployment);
  d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1x";
  m_api.set_versioned(kDeployment, d);
  int puts = m_api.puts();
  auto bad = once();
  ASSERT_FALSE(bad) << "the old reader took '1x' as 0 and said the template requests none";
  EXPECT_NE(bad.error().message.find("'1x'"), std::string::npos) << bad.error().message;
  EXPECT_EQ(m_api.puts(), puts);
}

// --- The loop (autoscale/run.hpp), on a fake clock: no process, no real waiting ---

namespace {

// Time moves only when the loop sleeps; `bound` stops a loop that waits on another clock.
struct FakeLoop {
  SteadyTime t = SteadyTime{} + 1000h;
  size_t sleeps = 0;
  std::vector<SteadyTime> steps;  // when each reconcile was reported
  std::vector<Controller::Step> results;
  SteadyTime bound = std::chrono::steady_clock::now() + 3s;

  AutoscaleLoop loop(std::chrono::milliseconds period, std::function<bool()> done) {
    AutoscaleLoop l;
    l.period = period;
    l.clock = {[this] { return t; },
               [this](std::chrono::milliseconds d) {
                 t += d;
                 ++sleeps;
               }};
    l.report = [this](const Controller::Step& s) {
      steps.push_back(t);
      results.push_back(s);
    };
    l.stop_requested = [this, done] { return done() || std::chrono::steady_clock::now() > bound; };
    return l;
  }
};

}  // namespace

TEST_F(AutoscaleController, TheLoopReconcilesEveryPeriodOfItsClockAndGivesTheLeaseBack) {
  LeaseOptions lease{"video", "gpufence-autoscale-deepstream", "loop", 45s};
  Controller c(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
               cluster_from_lists(*m_kube, m_opt.node_selector), m_events, lease);
  FakeLoop fake;
  std::vector<std::string> holders;
  auto loop = fake.loop(15s, [&] { return fake.steps.size() >= 3; });
  auto report = loop.report;
  loop.report = [&](const Controller::Step& s) {
    report(s);
    holders.push_back(m_api.object(kLease)["spec"]["holderIdentity"]);
  };
  auto end = run_autoscale_loop(c, loop);
  ASSERT_EQ(fake.steps.size(), 3u) << "the loop waited on a clock other than its own";
  EXPECT_EQ(fake.steps[1] - fake.steps[0], 15s);
  EXPECT_EQ(fake.steps[2] - fake.steps[1], 15s);
  for (const auto& s : fake.results) {
    EXPECT_FALSE(s.error) << s.error->message;
    EXPECT_TRUE(s.leader);
  }
  EXPECT_EQ(holders, (std::vector<std::string>{"loop", "loop", "loop"}));
  ASSERT_TRUE(fake.results[0].result);
  EXPECT_TRUE(fake.results[0].result->scaled) << "the leader's first reconcile scales";
  EXPECT_FALSE(end.last_step_failed);
  EXPECT_TRUE(end.released);
  EXPECT_EQ(m_api.object(kLease)["spec"]["holderIdentity"], "") << "released when stopped";
}

TEST_F(AutoscaleController, TheLoopsExitIsItsLastReconcilesAndOnceNeverSleeps) {
  test::TempDir dir;
  auto streams = dir / "streams";  // absent at first: the first reconcile fails
  Controller c(*m_kube, m_opt, streams_from_file(streams.string()),
               cluster_from_lists(*m_kube, m_opt.node_selector), m_events, std::nullopt);
  FakeLoop once;
  auto l = once.loop(15s, [] { return false; });
  l.repeat = Repeat::once;
  auto end = run_autoscale_loop(c, l);
  EXPECT_EQ(once.steps.size(), 1u);
  EXPECT_EQ(once.sleeps, 0u);
  EXPECT_TRUE(end.last_step_failed) << "no demand to read: exit 1";

  // Fails, then the file appears: the second reconcile stands, and so does the exit status.
  FakeLoop fake;
  auto loop = fake.loop(15s, [&] { return fake.steps.size() >= 2; });
  auto report = loop.report;
  loop.report = [&](const Controller::Step& s) {
    report(s);
    dir.write("streams", "16\n");
  };
  end = run_autoscale_loop(c, loop);
  ASSERT_EQ(fake.results.size(), 2u);
  EXPECT_TRUE(fake.results[0].error);
  EXPECT_FALSE(fake.results[1].error);
  EXPECT_FALSE(end.last_step_failed) << "an earlier failure the loop recovered from is no exit 1";
}

// SIGTERM is seen within a slice of the sleep, not after the whole period.
TEST_F(AutoscaleController, AStopRequestEndsTheLoopsSleepWithinASlice) {
  Controller c(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"),
               cluster_from_lists(*m_kube, m_opt.node_selector), m_events, std::nullopt);
  FakeLoop fake;
  const auto start = fake.t;
  auto end = run_autoscale_loop(c, fake.loop(1h, [&] { return fake.t - start >= 1s; }));
  EXPECT_EQ(fake.steps.size(), 1u);
  EXPECT_LE(fake.t - start, 1s + 100ms);
  EXPECT_FALSE(end.last_step_failed);
}

TEST(AutoscaleLease, NameAndDurationFromTheFlags) {
  AutoscaleOptions opt;
  opt.ns = "video";
  opt.deployment = "deepstream";
  auto l = lease_options(opt, "", "me", 0s, 15s);
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_EQ(l->ns, "video");
  EXPECT_EQ(l->name, "gpufence-autoscale-deepstream");
  EXPECT_EQ(l->identity, "me");
  EXPECT_EQ(l->duration, 45s) << "three periods";
  EXPECT_EQ(lease_options(opt, "", "me", 0s, 1s)->duration, 15s) << "at least 15 s";
  EXPECT_EQ(lease_options(opt, "", "me", 0s, 0s)->duration, 15s);
  EXPECT_EQ(lease_options(opt, "ops/l", "me", 20s, 15s)->duration, 20s) << "as given";
  EXPECT_EQ(lease_options(opt, "ops/l", "me", 20s, 15s)->ns, "ops");
  for (const char* bad : {"nolash", "/name", "ns/"}) {
    auto r = lease_options(opt, bad, "me", 0s, 15s);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("NAMESPACE/NAME"), std::string::npos);
  }
}
