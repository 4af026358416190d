// GPU health as the kubelet sees it, as a pure state machine: events and clock ticks in,
// "did anything change" out. The HealthMonitor (health_monitor.hpp) feeds it from NVML.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "deviceplugin/options.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

using SteadyTime = std::chrono::steady_clock::time_point;
// Whether a GPU answers the driver now; the error says why not (and becomes the reason).
using AliveCheck = std::function<Status(const std::string& uuid)>;

// One GPU's health as the metrics show it.
struct GpuHealthReport {
  std::string uuid;  // "" for XIDs the driver tied to no GPU
  bool healthy = true;
  std::string reason;
  std::map<std::uint64_t, std::uint64_t> xids;  // every XID seen, ignored ones too, by code
  std::uint64_t to_healthy = 0, to_unhealthy = 0;
  std::optional<GpuRecoveryAction> action;  // nullopt: the driver reports none
};

// A change of one GPU's health, for its log line, metric and Node Event.
struct HealthTransition {
  std::string uuid;
  bool healthy = true;
  std::string reason;  // why it became Unhealthy; for Healthy, why it was
};

class HealthTracker {
 public:
  // The most transitions kept for take_transitions(); older ones are dropped.
  static constexpr size_t kMaxTransitions = 256;
  HealthTracker(const std::vector<std::string>& uuids, HealthOptions options);

  // Returns true when some GPU's health changed.
  bool on_event(const GpuEvent& event, SteadyTime now, const AliveCheck& alive);
  // Recovery: XID-unhealthy GPUs after the quiet period, lost GPUs once they answer again; never
  // a GPU a permanent XID (79) marked.
  bool on_tick(SteadyTime now, const AliveCheck& alive);
  // The driver's recovery action for a GPU: anything but none makes it Unhealthy until the
  // driver says none again.
  bool on_recovery_action(const std::string& uuid, GpuRecoveryAction action, SteadyTime now);
  // GPUs whose last recovery action was not none: asked again until it is.
  std::vector<std::string> awaiting_action() const;
  std::vector<GpuHealthReport> report() const;
  // The transitions since the last call, oldest first.
  std::vector<HealthTransition> take_transitions();

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
    bool permanent = false;  // a permanent XID: no recovery until the plugin restarts
    bool awaiting = false;   // the driver's recovery action is not none
    bool by_action = false;  // the action, not an XID or a loss, made it Unhealthy
    std::string reason;
    SteadyTime last_critical{};
    std::map<std::uint64_t, std::uint64_t> xids;
    std::uint64_t to_healthy = 0, to_unhealthy = 0;
    std::optional<GpuRecoveryAction> action;
  };
  bool mark(const std::string& uuid, State& s, bool healthy, bool lost, std::string reason,
            SteadyTime now);

  HealthOptions m_options;
  std::map<std::string, State> m_state;
  std::map<std::uint64_t, std::uint64_t> m_unattributed_xids;
  std::vector<HealthTransition> m_transitions;
};

}  // namespace gpufence
