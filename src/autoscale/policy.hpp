// How many DeepStream pods the streams need, as pure functions: an HPA-like recommendation
// (kubernetes docs, horizontal-pod-autoscale.md: desired = ceil(current * metric/target), skipped
// inside a 10 % tolerance), capped by the free nvidia.com/gpu capacity so no pod is created that
// could only sit Pending (an HPA scaling into Pending pods gets stuck: kubernetes#79158), and
// stabilised like the HPA's default behaviour (scale-down takes the highest recommendation of the
// last 5 minutes; scale-up at most max(100 %, 4 pods) per 15 s).
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <utility>

namespace gpufence {

struct ScaleInput {
  long streams = 0;          // demand: video streams to process
  long streams_per_pod = 1;  // what one pod handles
  long current = 0;          // the Deployment's replicas now
  long min_replicas = 0, max_replicas = 10;
  long gpus_per_pod = 1;
  long free_gpus = 0;  // allocatable nvidia.com/gpu not yet requested by any pod
  double tolerance = 0.1;
};

struct Recommendation {
  long replicas = 0;
  bool capped_by_gpus = false;
  std::string reason;
};

Recommendation recommend(const ScaleInput& in);

using SteadyTime = std::chrono::steady_clock::time_point;

class Stabilizer {
 public:
  explicit Stabilizer(std::chrono::seconds down_window = std::chrono::seconds(300),
                      std::chrono::seconds up_period = std::chrono::seconds(15))
      : m_down_window(down_window), m_up_period(up_period) {}
  // The replicas to set now, given this loop's recommendation.
  long stabilize(long recommendation, long current, SteadyTime now);

 private:
  std::chrono::seconds m_down_window, m_up_period;
  std::deque<std::pair<SteadyTime, long>> m_history;  // recommendations in the window
};

}  // namespace gpufence
