// The plugin's Prometheus metrics (served by common/http_server.hpp).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace gpufence {

class PluginMetrics {
 public:
  // Upper bounds of the Allocate latency histogram, seconds (like the kubelet's own
  // kubelet_device_plugin_alloc_duration_seconds).
  static constexpr std::array<double, 10> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                      0.005,  0.01,    0.025,  0.1,   1.0};

  void observe_allocate(std::chrono::nanoseconds duration, bool ok, size_t containers);
  void count_registration() { ++m_registrations; }
  void count_kubelet_restart() { ++m_kubelet_restarts; }
  void set_devices(size_t healthy, size_t unhealthy) {
    m_healthy = healthy;
    m_unhealthy = unhealthy;
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
};

}  // namespace gpufence
