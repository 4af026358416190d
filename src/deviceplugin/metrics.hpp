// The plugin's Prometheus metrics (served by common/http_server.hpp).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "deviceplugin/health.hpp"
#include "gpu/gpu.hpp"
#include "podresources/podresources.hpp"

namespace gpufence {

// One GPU as its metrics show it (docs/monitoring.md): labelled as dcgm-exporter labels a GPU
// (gpu = index, UUID, device = nvidiaN, modelName), so a dashboard keyed by UUID joins them.
struct GpuMetricRow {
  Gpu gpu;
  GpuHealthReport health;
};
// The GPUs and their health now (the plugin's devices and its health monitor).
using GpuRows = std::function<std::vector<GpuMetricRow>()>;
// Which container holds which GPU (the kubelet's PodResources List), read at each scrape.
using GpuHolders = std::function<Result<std::vector<KubeletAllocation>>()>;

class PluginMetrics {
 public:
  // Upper bounds of the Allocate latency histogram, seconds (like the kubelet's own
  // kubelet_device_plugin_alloc_duration_seconds).
  static constexpr auto kHoldersMaxAge = std::chrono::seconds(10);
  static constexpr std::array<double, 10> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                      0.005,  0.01,    0.025,  0.1,   1.0};

  void observe_allocate(std::chrono::nanoseconds duration, bool ok, size_t containers);
  void count_registration() { ++m_registrations; }
  void count_kubelet_restart() { ++m_kubelet_restarts; }
  void set_devices(size_t healthy, size_t unhealthy) {
    m_healthy = healthy;
    m_unhealthy = unhealthy;
  }
  void set_gpu_rows(GpuRows rows) {
    std::lock_guard lock(m_mutex);
    m_rows = std::move(rows);
  }
  void set_gpu_holders(GpuHolders holders) {
    std::lock_guard lock(m_mutex);
    m_holders = std::move(holders);
  }
  std::string render(const std::string& resource) const;

 private:
  mutable std::mutex m_mutex;
  std::array<std::uint64_t, kBuckets.size()> m_bucket_counts{};
  std::uint64_t m_allocate_count = 0;
  double m_allocate_sum = 0;
  std::atomic<std::uint64_t> m_allocations{0}, m_allocate_errors{0}, m_registrations{0},
      m_kubelet_restarts{0};
  std::atomic<size_t> m_healthy{0}, m_unhealthy{0};
  GpuRows m_rows;
  GpuHolders m_holders;
  // The kubelet's answer, kept kHoldersMaxAge: scrapes, however many, ask PodResources (which the
  // kubelet rate-limits for every client on the node together) at most that often, one at a time.
  std::optional<Result<std::vector<KubeletAllocation>>> held() const;
  mutable std::mutex m_held_mutex;  // held by the one scrape asking the kubelet
  mutable std::optional<Result<std::vector<KubeletAllocation>>> m_held;
  mutable std::chrono::steady_clock::time_point m_held_at{};
};

// The per-GPU families: gpufence_gpu_info (one series per GPU and container holding it),
// gpufence_gpu_healthy, gpufence_gpu_xid_errors_total, gpufence_gpu_health_transitions_total,
// gpufence_gpu_recovery_action. `holders` nullopt: not asked; an error: the holders are unknown
// (gpufence_gpu_info carries none, gpufence_pod_resources_up is 0).
std::string render_gpu_metrics(
    const std::string& resource, const std::vector<GpuMetricRow>& rows,
    const std::optional<Result<std::vector<KubeletAllocation>>>& holders);

}  // namespace gpufence
