// `gpufence doctor --serve`: the doctor as a node agent. Every interval it gathers and judges the
// node again, keeps the metrics of the last run for /metrics, and with --report-node sets the
// Node condition GPUIsolation and posts Events for new findings (node_report.hpp). A run that
// cannot reach the API server still updates the metrics; the failure is logged and counted.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "doctor/metrics.hpp"
#include "doctor/node_report.hpp"
#include "doctor/snapshot.hpp"
#include "kube/client.hpp"

namespace gpufence {

// How often an unchanged Node condition is patched again (its lastHeartbeatTime).
inline constexpr auto kConditionRefresh = std::chrono::minutes(5);

struct DoctorAgentOptions {
  std::chrono::seconds interval{60};
  bool report_node = false;
  std::string node;  // this node's name in the API
};

struct DoctorRun {
  Snapshot snapshot;
  std::vector<Finding> findings;
};
// One gather and judge (the caller wires the host, NVML and the API server).
using RunDoctor = std::function<DoctorRun()>;
// Waits up to the given time; true when the agent is to stop.
using WaitForStop = std::function<bool(std::chrono::milliseconds)>;
using SystemClock = std::function<std::chrono::system_clock::time_point()>;

class DoctorAgent {
 public:
  DoctorAgent(RunDoctor run, KubeClient* kube, DoctorAgentOptions options, Logger& log,
              SystemClock clock = std::chrono::system_clock::now);

  // One run: gather and judge, the metrics, and with report_node the condition and Events.
  void step();
  // Runs step() every interval until `wait` says stop.
  void run(const WaitForStop& wait);

  // The last run's metrics, and the agent's own counters.
  std::string metrics() const;
  // For /healthz: a run finished within three intervals (or the agent started less than three
  // intervals ago).
  bool fresh() const;

 private:
  RunDoctor m_run;
  KubeClient* m_kube;
  DoctorAgentOptions m_opt;
  Logger& m_log;
  SystemClock m_clock;
  std::chrono::system_clock::time_point m_started;
  FindingEvents m_events;
  std::optional<NodeCondition> m_condition;  // what the last patch set, and when
  std::chrono::system_clock::time_point m_condition_at{};
  mutable std::mutex m_mutex;
  std::string m_metrics;
  DoctorRuns m_runs{0, {}, {}};
  std::uint64_t m_report_failures = 0;
};

}  // namespace gpufence
