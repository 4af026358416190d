// gpufence autoscale: the pure policy, and reconciles against a test API server (none can be
// installed here) that answers 409 on stale writes as the real one does.
#include <gtest/gtest.h>

#include "autoscale/controller.hpp"
#include "support/test_api_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

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

namespace {

class AutoscaleController : public ::testing::Test {
 protected:
  const std::string kScale = "/apis/apps/v1/namespaces/video/deployments/deepstream/scale";
  void SetUp() override {
    m_api.set(
        "/api/v1/nodes?labelSelector=gpu%3Dtrue", 200,
        R"({"items":[{"metadata":{"name":"gpu-1"},"status":{"allocatable":{"nvidia.com/gpu":"2"}}},
                           {"metadata":{"name":"gpu-2"},"status":{"allocatable":{"nvidia.com/gpu":"2"}}}]})");
    pods(
        R"({"metadata":{"name":"ds-1"},"spec":{"nodeName":"gpu-1","containers":[{"resources":{"limits":{"nvidia.com/gpu":"1"}}}]},"status":{"phase":"Running"}},
            {"metadata":{"name":"done"},"spec":{"nodeName":"gpu-1","containers":[{"resources":{"limits":{"nvidia.com/gpu":"1"}}}]},"status":{"phase":"Succeeded"}},
            {"metadata":{"name":"pending"},"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"1"}}}]},"status":{"phase":"Pending"}},
            {"metadata":{"name":"cpu"},"spec":{"nodeName":"cpu-1","containers":[{"resources":{"limits":{"nvidia.com/gpu":"1"}}}]},"status":{"phase":"Running"}})");
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
  }
  void pods(const std::string& items) {
    m_api.set("/api/v1/pods", 200, R"({"items":[)" + items + "]}");
  }
  Result<ReconcileResult> once() {
    return reconcile(*m_kube, m_opt, streams_from_configmap(*m_kube, "video/streams:count"), m_stab,
                     std::chrono::steady_clock::now());
  }
  long replicas() { return m_api.object(kScale)["spec"]["replicas"].get<long>(); }

  test::TestApiServer m_api;
  std::unique_ptr<KubeClient> m_kube;
  AutoscaleOptions m_opt;
  Stabilizer m_stab;
};

}  // namespace

TEST_F(AutoscaleController, ScalesUpOnlyAsFarAsFreeGpusAllow) {
  EXPECT_EQ(free_gpus(*m_kube, "gpu=true", "nvidia.com/gpu").value(), 2)
      << "4 allocatable - running - pending";
  auto r = once();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->streams, 40);
  EXPECT_EQ(r->desired, 3) << "wants 5; 2 free GPUs add 2 pods";
  EXPECT_TRUE(r->scaled);
  EXPECT_EQ(replicas(), 3);
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
}

TEST_F(AutoscaleController, TheBinaryReconcilesOnce) {
  test::TempDir dir;
  auto cfg = dir.write("kubeconfig", m_api.kubeconfig());
  auto streams = dir.write("streams", "16\n");
  auto r = test::run_command({test::bin_path("gpufence"), "autoscale", "--kubeconfig", cfg.string(),
                              "--deployment", "video/deepstream", "--streams-per-pod", "8",
                              "--streams-file", streams.string(), "--node-selector", "gpu=true",
                              "--once"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("replicas 1 -> 2 (scaled)"), std::string::npos) << r.out;
  EXPECT_EQ(replicas(), 2);
}
