#include "doctor/agent.hpp"

#include "common/prometheus.hpp"
#include "common/strings.hpp"

namespace gpufence {

DoctorAgent::DoctorAgent(RunDoctor run, KubeClient* kube, DoctorAgentOptions options, Logger& log,
                         SystemClock clock)
    : m_run(std::move(run)),
      m_kube(kube),
      m_opt(std::move(options)),
      m_log(log),
      m_clock(std::move(clock)),
      m_started(m_clock()),
      m_events(m_opt.node, {std::string(kDoctorEventController), m_opt.node}) {}

void DoctorAgent::step() {
  // 1. Gather and judge.
  auto began = m_clock();
  DoctorRun r = m_run();
  auto ended = m_clock();
  std::vector<std::string> errors;
  for (const auto& f : r.findings)
    if (f.severity == Severity::error) errors.push_back(f.id);
  m_log.info("doctor.run", {{"findings", std::to_string(r.findings.size())},
                            {"errors", std::to_string(errors.size())},
                            {"error_ids", join(errors, ",")}});
  // 2. The metrics of this run, before the API server is asked anything: a slow one never
  // leaves /metrics behind.
  {
    std::lock_guard lock(m_mutex);
    m_runs.runs += 1;
    m_runs.last_run = ended;
    m_runs.last_duration = ended - began;
    m_metrics = render_doctor_metrics(r.snapshot, r.findings, m_runs);
  }
  // 3. Where operators look: the Node condition (patched when it changes, else every
  // kConditionRefresh: each patch is a write every watcher of Nodes receives) with an Event when
  // its status changes, and an Event for each new finding.
  if (!m_opt.report_node || !m_kube) return;
  std::uint64_t failures = 0;
  NodeCondition condition = isolation_condition(r.findings, r.snapshot.allocations.has_value());
  const bool changed = !m_condition || m_condition->status != condition.status ||
                       m_condition->reason != condition.reason ||
                       m_condition->message != condition.message;
  if (changed || ended - m_condition_at >= kConditionRefresh) {
    if (auto st = set_node_condition(*m_kube, m_opt.node, condition); !st) {
      ++failures;
      m_log.warn("doctor.condition-failed", {{"node", m_opt.node}, {"error", st.error().message}});
    } else {
      if (m_condition && m_condition->status != condition.status) {
        if (auto ev = m_events.post_condition_change(*m_kube, condition); !ev) ++failures;
      }
      if (!m_condition || m_condition->status != condition.status)
        m_log.info("doctor.condition", {{"node", m_opt.node},
                                        {"type", condition.type},
                                        {"status", condition.status},
                                        {"reason", condition.reason}});
      m_condition = condition;
      m_condition_at = ended;
    }
  }
  if (auto st = m_events.post_new(*m_kube, r.findings); !st) {
    ++failures;
    m_log.warn("doctor.events-failed", {{"error", st.error().message}});
  }
  std::lock_guard lock(m_mutex);
  m_report_failures += failures;
}

void DoctorAgent::run(const WaitForStop& wait) {
  do {
    step();
  } while (!wait(m_opt.interval));
}

std::string DoctorAgent::metrics() const {
  std::lock_guard lock(m_mutex);
  PromText own;
  own.family("gpufence_doctor_report_failures_total", "counter",
             "Node condition updates and Events the API server did not take.");
  own.sample("gpufence_doctor_report_failures_total", {}, m_report_failures);
  return m_metrics + own.text();
}

bool DoctorAgent::fresh() const {
  std::lock_guard lock(m_mutex);
  auto since = m_runs.runs ? m_runs.last_run : m_started;
  return m_clock() - since < 3 * m_opt.interval;
}

}  // namespace gpufence
