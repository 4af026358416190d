#include "deviceplugin/health.hpp"

namespace gpufence {

HealthTracker::HealthTracker(const std::vector<std::string>& uuids, HealthOptions options)
    : m_options(std::move(options)) {
  for (const auto& u : uuids) m_state[u] = State{};
}

bool HealthTracker::mark(State& s, bool healthy, bool lost, std::string reason, SteadyTime now) {
  bool changed = s.healthy != healthy;
  s.healthy = healthy;
  s.lost = lost;
  s.reason = healthy ? std::string() : std::move(reason);
  if (!healthy) s.last_critical = now;
  return changed;
}

bool HealthTracker::on_event(const GpuEvent& event, SteadyTime now, const AliveCheck& alive) {
  if (!m_options.enabled) return false;
  bool changed = false;
  if (event.gpu_lost) {
    // NVML does not say which GPU fell off the bus: ask each one.
    for (auto& [uuid, s] : m_state) {
      if (auto st = alive(uuid); !st)
        changed |= mark(s, false, true, "lost: " + st.error().message, now);
    }
    return changed;
  }
  if (m_options.ignored_xids.contains(event.xid)) return false;
  std::string reason = cat("xid ", event.xid);
  if (event.uuid.empty()) {
    // An XID we cannot tie to a GPU: every GPU is suspect (NVIDIA's plugin does the same).
    for (auto& [uuid, s] : m_state) changed |= mark(s, false, false, reason, now);
    return changed;
  }
  auto it = m_state.find(event.uuid);
  if (it == m_state.end()) return false;
  return mark(it->second, false, false, reason, now);
}

bool HealthTracker::on_tick(SteadyTime now, const AliveCheck& alive) {
  bool changed = false;
  for (auto& [uuid, s] : m_state) {
    if (s.healthy) continue;
    if (s.lost) {
      if (auto st = alive(uuid))
        changed |= mark(s, true, false, "", now);
      else
        s.reason = "lost: " + st.error().message;  // why it is still lost may change
    } else if (m_options.recovery && now - s.last_critical >= *m_options.recovery) {
      changed |= mark(s, true, false, "", now);
    }
  }
  return changed;
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
