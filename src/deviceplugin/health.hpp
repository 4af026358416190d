// GPU health as the kubelet sees it, as a pure state machine: events and clock ticks in,
// "did anything change" out. The HealthMonitor (health_monitor.hpp) feeds it from NVML.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "deviceplugin/options.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

using SteadyTime = std::chrono::steady_clock::time_point;
// Whether a GPU answers the driver now; the error says why not (and becomes the reason).
using AliveCheck = std::function<Status(const std::string& uuid)>;

class HealthTracker {
 public:
  HealthTracker(const std::vector<std::string>& uuids, HealthOptions options);

  // Returns true when some GPU's health changed.
  bool on_event(const GpuEvent& event, SteadyTime now, const AliveCheck& alive);
  // Recovery: XID-unhealthy GPUs after the quiet period, lost GPUs once they answer again.
  bool on_tick(SteadyTime now, const AliveCheck& alive);

  bool healthy(const std::string& uuid) const;
  // The GPUs on_tick will ask `alive` about: the lost ones. Lets the caller ask NVML first,
  // outside any lock, and hand on_tick the answers.
  std::vector<std::string> lost() const;
  std::vector<std::string> uuids() const;
  // Why a GPU is unhealthy ("xid 48", "lost"); empty when healthy.
  std::string reason(const std::string& uuid) const;

 private:
  struct State {
    bool healthy = true;
    bool lost = false;
    std::string reason;
    SteadyTime last_critical{};
  };
  bool mark(State& s, bool healthy, bool lost, std::string reason, SteadyTime now);

  HealthOptions m_options;
  std::map<std::string, State> m_state;
};

}  // namespace gpufence
