#include "autoscale/policy.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "common/saturating.hpp"

namespace gpufence {

Recommendation recommend(const ScaleInput& in) {
  Recommendation r;
  long per_pod = std::max(1L, in.streams_per_pod);
  // ceil(streams / per_pod) without streams + per_pod - 1, which wraps for a count near
  // LONG_MAX (and turned the largest demand into 0 pods).
  long wanted = ceil_div(std::max(0L, in.streams), per_pod);
  // Inside the tolerance band around the current size, stay (avoids flapping on noise).
  if (in.current > 0) {
    double ratio = static_cast<double>(in.streams) /
                   (static_cast<double>(in.current) * static_cast<double>(per_pod));
    if (std::abs(ratio - 1.0) <= in.tolerance && wanted <= in.current) wanted = in.current;
  }
  long bounded = std::clamp(wanted, in.min_replicas, std::max(in.min_replicas, in.max_replicas));
  r.reason = cat(in.streams, " streams / ", per_pod, " per pod -> ", wanted, " pod(s)");
  if (bounded != wanted)
    r.reason += cat(", bounded to [", in.min_replicas, ", ", in.max_replicas, "]");
  // Never ask for more pods than free GPUs can hold: those pods would only sit Pending.
  long gpus_per_pod = std::max(1L, in.gpus_per_pod);
  long can_add = std::max(0L, in.free_gpus) / gpus_per_pod;
  if (bounded > sat_add(in.current, can_add)) {
    bounded = sat_add(in.current, can_add);
    r.capped_by_gpus = true;
    r.reason += cat(", capped at ", bounded, " by ", in.free_gpus, " free GPU(s)");
  }
  r.replicas = bounded;
  return r;
}

long Stabilizer::stabilize(long recommendation, long current, SteadyTime now) {
  m_history.emplace_back(now, recommendation);
  while (!m_history.empty() && now - m_history.front().first > m_down_window) m_history.pop_front();
  if (recommendation < current) {
    // Scale down only as far as the highest recommendation of the window allows.
    long highest = recommendation;
    for (const auto& [t, r] : m_history) highest = std::max(highest, r);
    return std::min(current, highest);
  }
  if (recommendation > current) {
    long step = std::max(current, 4L);  // max(100 %, 4 pods) per period
    return std::min(recommendation, sat_add(current, step));
  }
  return current;
}

}  // namespace gpufence
