// The plugin's Prometheus metrics and small HTTP listeners for /metrics and /healthz.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.hpp"

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

// A small HTTP/1.0 listener for GET /metrics and GET /healthz on one TCP address
// ("127.0.0.1:9400", ":9400"), on its own thread, serving many clients at once. Either route may be
// left out (nullptr: 404), so liveness gets a listener of its own: a flood of the metrics port
// (idle or byte-at-a-time clients) fills only that listener's client slots, and the kubelet's
// probe still finds a free socket, thread and slots on the health port (docs/deviceplugin.md,
// "/metrics and /healthz"). Every connection is bounded: kRequestDeadline to send its request,
// kClientDeadline to the last byte of the answer, kMaxClients at once (past that, the waiting
// client that has sent the least is dropped, after every request already sent has been read).
class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  static constexpr auto kRequestDeadline = std::chrono::seconds(2);
  static constexpr auto kClientDeadline = std::chrono::seconds(10);
  static constexpr size_t kMaxClients = 32;
  static constexpr int kBacklog = 128;

  MetricsServer() = default;
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // `metrics` answers /metrics and `healthy` /healthz; a null one leaves its path at 404.
  Status start(const std::string& address, Render metrics, std::function<bool()> healthy);
  void stop();
  int port() const { return m_port; }

 private:
  void serve();
  std::string answer(const std::string& request) const;
  int m_listen_fd = -1;
  int m_stop_pipe[2] = {-1, -1};
  int m_port = 0;
  Render m_render;
  std::function<bool()> m_healthy;
  std::thread m_thread;
};

}  // namespace gpufence
