// The health monitor: one thread turning NVML events and liveness answers into HealthTracker
// changes. Every NVML call goes through the NvmlWatchdog and is made with no lock held, so a hung
// NVML can delay only this thread: Allocate, ListAndWatch and stop never wait for it. A GPU
// whose liveness call misses the deadline becomes Unhealthy ("lost: ... did not return").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "deviceplugin/health.hpp"
#include "deviceplugin/watchdog.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

// A GPU as the monitor logs it: the id the kubelet sees and its UUID.
struct MonitoredGpu {
  std::string id;
  std::string uuid;
};

class HealthMonitor {
 public:
  // Called on the monitor thread, with no lock held, after some GPU's health changed.
  using OnChange = std::function<void()>;

  HealthMonitor(GpuInventory& inventory, NvmlWatchdog& watchdog,
                const std::vector<MonitoredGpu>& gpus, HealthOptions options, Logger& log,
                OnChange on_change);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  Status start();
  // Returns within a poll interval whatever NVML does: the thread waits on NVML only through
  // the watchdog, which gives up on a stop.
  void stop();

  // One round, as the thread runs it: wait for an event (up to the poll interval), ask the GPUs
  // that need it whether they answer, apply. True when some GPU's health changed. For tests.
  bool step();

  bool healthy(const std::string& uuid) const;
  std::string reason(const std::string& uuid) const;
  // Every GPU's health, XID counts and recovery action, for the metrics.
  std::vector<GpuHealthReport> report() const;
  // The health changes since the last call, for their Node Events.
  std::vector<HealthTransition> take_transitions();

  struct Impl;

 private:
  std::unique_ptr<Impl> m;
  std::thread m_thread;
};

}  // namespace gpufence
