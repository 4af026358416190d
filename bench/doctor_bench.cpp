// gpufence doctor's snapshot + judge on a fake node: N containers (110 = the kubelet's default
// pod limit) and 8 GPUs, each container holding one GPU and running two processes. Reported
// with Google Benchmark's complexity fit to show it grows linearly with containers.
#include <benchmark/benchmark.h>

#include "deviceplugin/metrics.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/metrics.hpp"
#include "doctor/report.hpp"
#include "pod_resources_server.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

void BM_DoctorSnapshotAndJudge(benchmark::State& state) {
  const auto containers = static_cast<unsigned>(state.range(0));
  test::TempDir dir;
  test::FakeNode node(dir.path());
  test::FakeInventory inv;
  inv.list = test::fake_gpus(8);
  std::vector<test::PodAllocation> allocations;
  for (unsigned i = 0; i < containers; ++i) {
    test::FakeContainer c;
    c.pod = "pod" + std::to_string(i);
    c.pids = {1000 + 2 * i, 1001 + 2 * i};
    unsigned gpu = i % 8;
    std::string uuid = inv.list[gpu].uuid;
    c.env = "NVIDIA_VISIBLE_DEVICES=" + uuid + std::string(1, '\0') +
            "CUDA_VISIBLE_DEVICES=" + uuid + std::string(1, '\0');
    c.dev_minors = {gpu};
    c.devices_list = "c 195:" + std::to_string(gpu) + " rw\n";
    node.add(c);
    allocations.push_back({"default", c.pod, "main", {uuid}});
    inv.procs[uuid].push_back({1000 + 2 * i, 1});
  }
  std::vector<std::string> allocatable;
  for (const auto& g : inv.list) allocatable.push_back(g.uuid);
  test::PodResourcesServer kubelet((dir / "var/lib/kubelet/pod-resources/kubelet.sock").string(),
                                   "nvidia.com/gpu", allocations, allocatable);
  kubelet.start();
  HostFs host(dir.path());
  size_t findings = 0;
  for (auto _ : state) {
    auto snap = gather_snapshot(host, {}, {.inventory = inv});
    auto f = judge(snap);
    findings = f.size();
    benchmark::DoNotOptimize(f);
  }
  state.SetComplexityN(containers);
  state.counters["findings"] = static_cast<double>(findings);
}
BENCHMARK(BM_DoctorSnapshotAndJudge)
    ->Arg(10)
    ->Arg(30)
    ->Arg(55)
    ->Arg(110)
    ->Arg(220)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oN);

// The doctor agent's two outputs of one run, side by side: its /metrics text (what a scrape
// reads) against the text report (the baseline every doctor run already paid), on the same
// snapshot of N containers each holding one of 8 GPUs.
struct RunOfN {
  test::TempDir dir;
  Snapshot snap;
  std::vector<Finding> findings;
  explicit RunOfN(unsigned containers) {
    test::FakeNode node(dir.path());
    test::FakeInventory inv;
    inv.list = test::fake_gpus(8);
    std::vector<test::PodAllocation> allocations;
    for (unsigned i = 0; i < containers; ++i) {
      test::FakeContainer c;
      c.pod = "pod" + std::to_string(i);
      c.pids = {1000 + 2 * i};
      unsigned gpu = i % 8;
      c.dev_minors = {gpu};
      c.devices_list = "c 195:" + std::to_string(gpu) + " rw\n";
      node.add(c);
      allocations.push_back({"default", c.pod, "main", {inv.list[gpu].uuid}});
    }
    std::vector<std::string> allocatable;
    for (const auto& g : inv.list) allocatable.push_back(g.uuid);
    test::PodResourcesServer kubelet((dir / "var/lib/kubelet/pod-resources/kubelet.sock").string(),
                                     "nvidia.com/gpu", allocations, allocatable);
    kubelet.start();
    snap = gather_snapshot(HostFs(dir.path()), {}, {.inventory = inv});
    findings = judge(snap);
  }
};

void BM_DoctorMetricsText(benchmark::State& state) {
  RunOfN run(static_cast<unsigned>(state.range(0)));
  size_t bytes = 0;
  for (auto _ : state) {
    auto text = render_doctor_metrics(run.snap, run.findings, {});
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_DoctorMetricsText)->Arg(110)->Arg(220)->Unit(benchmark::kMicrosecond);

void BM_DoctorReportText_Baseline(benchmark::State& state) {
  RunOfN run(static_cast<unsigned>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(render_doctor_text(run.snap, run.findings));
}
BENCHMARK(BM_DoctorReportText_Baseline)->Arg(110)->Arg(220)->Unit(benchmark::kMicrosecond);

// One scrape of the device plugin's /metrics with 8 GPUs: with the pods holding them read from
// the kubelet's PodResources (a gRPC List and GetAllocatableResources of N containers) against
// the same scrape without them (the baseline: what /metrics cost before pod labels).
void BM_DevicePluginScrape(benchmark::State& state) {
  const auto containers = static_cast<unsigned>(state.range(0));
  const bool with_pods = state.range(1) != 0;
  test::TempDir dir;
  auto gpus = test::fake_gpus(8);
  std::vector<test::PodAllocation> allocations;
  for (unsigned i = 0; i < containers; ++i)
    allocations.push_back(
        {"default", "pod" + std::to_string(i), "main",
         i < 8 ? std::vector<std::string>{gpus[i].uuid} : std::vector<std::string>{}});
  std::vector<std::string> allocatable;
  for (const auto& g : gpus) allocatable.push_back(g.uuid);
  const std::string socket = (dir / "kubelet.sock").string();
  test::PodResourcesServer kubelet(socket, "nvidia.com/gpu", allocations, allocatable);
  kubelet.start();
  PluginMetrics metrics;
  metrics.set_gpu_rows([&] {
    std::vector<GpuMetricRow> rows;
    for (const auto& g : gpus) rows.push_back({g, {g.uuid, true, "", {{48, 1}}, 0, 0, {}}});
    return rows;
  });
  if (with_pods)
    metrics.set_gpu_holders(
        [&] { return list_pod_resources(socket, "nvidia.com/gpu", std::chrono::seconds(2)); });
  for (auto _ : state) benchmark::DoNotOptimize(metrics.render("nvidia.com/gpu"));
}
BENCHMARK(BM_DevicePluginScrape)
    ->Args({110, 0})
    ->Args({110, 1})
    ->ArgNames({"containers", "pods"})
    ->Unit(benchmark::kMicrosecond);

// The PodResources List a scrape pays at most every PluginMetrics::kHoldersMaxAge (10 s).
void BM_PodResourcesList(benchmark::State& state) {
  const auto containers = static_cast<unsigned>(state.range(0));
  test::TempDir dir;
  auto gpus = test::fake_gpus(8);
  std::vector<test::PodAllocation> allocations;
  for (unsigned i = 0; i < containers; ++i)
    allocations.push_back(
        {"default", "pod" + std::to_string(i), "main",
         i < 8 ? std::vector<std::string>{gpus[i].uuid} : std::vector<std::string>{}});
  const std::string socket = (dir / "kubelet.sock").string();
  test::PodResourcesServer kubelet(socket, "nvidia.com/gpu", allocations, {});
  kubelet.start();
  for (auto _ : state)
    benchmark::DoNotOptimize(list_pod_resources(socket, "nvidia.com/gpu", std::chrono::seconds(2)));
}
BENCHMARK(BM_PodResourcesList)->Arg(110)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
