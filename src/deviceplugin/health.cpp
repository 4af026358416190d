#include "deviceplugin/health.hpp"

#include <utility>

namespace gpufence {

HealthTracker::HealthTracker(const std::vector<std::string>& uuids, HealthOptions options)
    : m_options(std::move(options)) {
  for (const auto& u : uuids) m_state[u] = State{};
}

bool HealthTracker::mark(const std::string& uuid, State& s, bool healthy, bool lost,
                         std::string reason, SteadyTime now) {
  bool changed = s.healthy != healthy;
  if (changed) {
    ++(healthy ? s.to_healthy : s.to_unhealthy);
    // Kept for a consumer that takes them (the device plugin's Node Events); bounded for one
    // that never does (gpufence-dra).
    if (m_transitions.size() >= kMaxTransitions) m_transitions.erase(m_transitions.begin());
    m_transitions.push_back({uuid, healthy, healthy ? s.reason : reason});
  }
  s.healthy = healthy;
  s.lost = lost;
  s.reason = healthy ? std::string() : std::move(reason);
  if (!healthy) s.last_critical = now;
  if (healthy) s.awaiting = false;
  return changed;
}

bool HealthTracker::on_event(const GpuEvent& event, SteadyTime now, const AliveCheck& alive) {
  if (!m_options.enabled) return false;
  bool changed = false;
  if (event.gpu_lost) {
    // NVML does not say which GPU fell off the bus: ask each one.
    for (auto& [uuid, s] : m_state) {
      if (auto st = alive(uuid); !st)
        changed |= mark(uuid, s, false, true, "lost: " + st.error().message, now);
    }
    return changed;
  }
  auto it = m_state.find(event.uuid);
  ++(it == m_state.end() ? m_unattributed_xids : it->second.xids)[event.xid];
  if (m_options.ignored_xids.contains(event.xid) || event.xid == kRecoveryActionChangedXid)
    return false;
  const bool permanent = m_options.permanent_xids.contains(event.xid);
  std::string reason = cat("xid ", event.xid);  // gpufence-dra's taint reads the number
  if (event.uuid.empty()) {
    // An XID we cannot tie to a GPU: every GPU is suspect (NVIDIA's plugin does the same).
    for (auto& [uuid, s] : m_state) {
      changed |= mark(uuid, s, false, s.lost, reason, now);
      s.permanent |= permanent;
      s.by_action = false;
    }
    return changed;
  }
  if (it == m_state.end()) return false;
  changed = mark(it->first, it->second, false, it->second.lost, reason, now);
  it->second.permanent |= permanent;
  it->second.by_action = false;  // an XID holds it now, whatever the action says later
  return changed;
}

bool HealthTracker::on_tick(SteadyTime now, const AliveCheck& alive) {
  bool changed = false;
  for (auto& [uuid, s] : m_state) {
    if (s.healthy || s.permanent || s.awaiting) continue;
    if (s.lost) {
      if (auto st = alive(uuid))
        changed |= mark(uuid, s, true, false, "", now);
      else
        s.reason = "lost: " + st.error().message;  // why it is still lost may change
    } else if (m_options.recovery && now - s.last_critical >= *m_options.recovery) {
      changed |= mark(uuid, s, true, false, "", now);
    }
  }
  return changed;
}

bool HealthTracker::on_recovery_action(const std::string& uuid, GpuRecoveryAction action,
                                       SteadyTime now) {
  auto it = m_state.find(uuid);
  if (it == m_state.end() || !m_options.enabled) return false;
  State& s = it->second;
  s.action = action;
  if (action != GpuRecoveryAction::none) {
    // An XID or a loss that made it Unhealthy keeps its reason (gpufence-dra's NoExecute taint
    // reads it); the action only holds the GPU longer.
    bool changed = false;
    if (s.healthy) {
      changed =
          mark(uuid, s, false, s.lost, cat("recovery action ", recovery_action_name(action)), now);
      s.by_action = true;
    }
    s.awaiting = true;
    return changed;
  }
  // The driver says nothing is needed: a GPU the action made Unhealthy is Healthy again; one an
  // XID or a loss made Unhealthy first keeps to those rules.
  if (!s.awaiting) return false;
  const bool by_action = s.by_action;
  s.awaiting = s.by_action = false;
  if (!by_action || s.permanent || s.lost) return false;
  return mark(uuid, s, true, false, "", now);
}

std::vector<std::string> HealthTracker::awaiting_action() const {
  std::vector<std::string> out;
  for (const auto& [uuid, s] : m_state)
    if (s.awaiting) out.push_back(uuid);
  return out;
}

std::vector<GpuHealthReport> HealthTracker::report() const {
  std::vector<GpuHealthReport> out;
  for (const auto& [uuid, s] : m_state)
    out.push_back({uuid, s.healthy, s.reason, s.xids, s.to_healthy, s.to_unhealthy, s.action});
  if (!m_unattributed_xids.empty()) out.push_back({"", true, "", m_unattributed_xids, 0, 0, {}});
  return out;
}

std::vector<HealthTransition> HealthTracker::take_transitions() {
  return std::exchange(m_transitions, {});
}

bool HealthTracker::healthy(const std::string& uuid) const {
  auto it = m_state.find(uuid);
  return it == m_state.end() || it->second.healthy;
}

std::string HealthTracker::reason(const std::string& uuid) const {
  auto it = m_state.find(uuid);
  return it == m_state.end() ? std::string() : it->second.reason;
}

std::vector<std::string> HealthTracker::lost() const {
  std::vector<std::string> out;
  for (const auto& [uuid, s] : m_state) {
    if (!s.healthy && s.lost) out.push_back(uuid);
  }
  return out;
}

std::vector<std::string> HealthTracker::uuids() const {
  std::vector<std::string> out;
  for (const auto& [uuid, s] : m_state) out.push_back(uuid);
  return out;
}

}  // namespace gpufence
