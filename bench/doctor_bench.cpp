// gpufence doctor's snapshot + judge on a fake node: N containers (110 = the kubelet's default
// pod limit) and 8 GPUs, each container holding one GPU and running two processes. Reported
// with Google Benchmark's complexity fit to show it grows linearly with containers.
#include <benchmark/benchmark.h>

#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
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

}  // namespace

BENCHMARK_MAIN();
