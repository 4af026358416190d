#include "doctor/metrics.hpp"

#include <map>
#include <utility>

#include "common/prometheus.hpp"
#include "common/strings.hpp"
#include "doctor/checks.hpp"

namespace gpufence {

namespace {

// One series per GPU a container of the kubelet's can open, labelled as dcgm-exporter labels a
// GPU (gpu = index, UUID, device) so a dashboard joins them; allocated="false" is the alert.
// gpufence's own pods (they open every GPU through NVML) and containers the kubelet does not list
// (no allocation to compare with) are left out, as the doctor's checks leave them.
void container_access(PromText& out, const Snapshot& s) {
  out.family("gpufence_container_gpu_access", "gauge",
             "A GPU this container can open (1), and whether the kubelet allocated it to the "
             "container; source says how that was learned (probe: opened, else the cgroup's "
             "rules).");
  for (const auto& c : s.containers) {
    if (!c.openable || own_pod(s, c)) continue;
    auto allocated = allocated_minors(s, c);
    if (!allocated) continue;
    for (unsigned minor : *c.openable) {
      std::string index, uuid;
      for (const auto& g : s.gpus) {
        if (g.gpu.minor != minor) continue;
        index = std::to_string(g.gpu.index);
        uuid = g.gpu.uuid;
      }
      out.sample("gpufence_container_gpu_access",
                 {{"namespace", c.pod_namespace},
                  {"pod", c.pod},
                  {"container", c.name},
                  {"gpu", index},
                  {"UUID", uuid},
                  {"device", cat("nvidia", minor)},
                  {"allocated", allocated->contains(minor) ? "true" : "false"},
                  {"source", c.openable_source}},
                 std::uint64_t{1});
    }
  }
}

void finding_counts(PromText& out, const std::vector<Finding>& findings) {
  std::map<std::pair<std::string, Severity>, std::uint64_t> counts;
  for (const auto& f : findings) ++counts[{f.id, f.severity}];
  out.family("gpufence_doctor_findings", "gauge",
             "Findings of the doctor's last run, by id and severity (docs/doctor.md).");
  for (const auto& [key, n] : counts)
    out.sample("gpufence_doctor_findings",
               {{"id", key.first}, {"severity", std::string(severity_name(key.second))}}, n);
}

// What gpufence-nri decided since it started, as its status file last counted it (written every
// few seconds; a restart of the plugin starts from zero, a counter reset to Prometheus).
void nri_decisions(PromText& out, const nri::NriDecisionCounters& d) {
  out.family("gpufence_nri_decisions_total", "counter",
             "gpufence-nri's CreateContainer decisions, by outcome (granted: GPUs given; no_gpu; "
             "node_agent: gpufence's own pods; refused).");
  for (std::string_view outcome : {"granted", "no_gpu", "node_agent", "refused"}) {
    auto it = d.outcomes.find(std::string(outcome));
    out.sample("gpufence_nri_decisions_total", {{"outcome", std::string(outcome)}},
               it == d.outcomes.end() ? std::uint64_t{0} : it->second);
  }
  out.family("gpufence_nri_refusals_total", "counter",
             "Containers gpufence-nri refused, by cause (denied: isolation cannot be proven or "
             "the decision ran out of time; invalid: past a request limit; error).");
  for (std::string_view reason : {"denied", "invalid", "error"}) {
    auto it = d.refusals.find(std::string(reason));
    out.sample("gpufence_nri_refusals_total", {{"reason", std::string(reason)}},
               it == d.refusals.end() ? std::uint64_t{0} : it->second);
  }
  out.family("gpufence_nri_decision_duration_seconds", "histogram",
             "How long gpufence-nri took to decide a container.");
  for (size_t i = 0; i < d.buckets.size(); ++i) {
    out.sample("gpufence_nri_decision_duration_seconds_bucket",
               {{"le", prom_number(nri::NriDecisionCounters::kBuckets[i])}}, d.buckets[i]);
  }
  out.sample("gpufence_nri_decision_duration_seconds_bucket", {{"le", "+Inf"}}, d.count);
  out.sample("gpufence_nri_decision_duration_seconds_sum", {}, d.sum_seconds);
  out.sample("gpufence_nri_decision_duration_seconds_count", {}, d.count);
}

// gpufence-nri's state, where the node enforces with it (the install record says so, or the
// plugin is seen live).
void nri_state(PromText& out, const Snapshot& s) {
  if (!s.nri || !s.nri->enforcing()) return;
  const NriView& n = *s.nri;
  out.family("gpufence_nri_connected", "gauge",
             "gpufence-nri is connected to containerd and its process is alive (1).");
  out.sample("gpufence_nri_connected", {}, std::uint64_t{n.live() ? 1u : 0u});
  out.family("gpufence_nri_fail_closed", "gauge",
             "containerd requires gpufence-nri (required_plugins) and reads no waiver annotation "
             "a pod could set (1): containers are refused while it is down.");
  out.sample("gpufence_nri_fail_closed", {},
             std::uint64_t{n.fail_closed() && n.tolerate_annotation.empty() ? 1u : 0u});
  if (n.status) {
    out.family("gpufence_nri_created_while_down", "gauge",
               "Containers containerd created without gpufence-nri's decision, as found at its "
               "last Synchronize.");
    out.sample("gpufence_nri_created_while_down", {},
               static_cast<std::uint64_t>(n.status->unenforced.size()));
    nri_decisions(out, n.status->decisions);
  }
}

// Whether the run could compare anything: without the kubelet's allocations no container is
// judged, and gpufence_container_gpu_access has no series at all.
void sources_of(PromText& out, const Snapshot& s) {
  out.family("gpufence_doctor_pod_resources_up", "gauge",
             "The last run read the kubelet's PodResources (1); 0: no container's access was "
             "compared with its allocation.");
  out.sample("gpufence_doctor_pod_resources_up", {}, std::uint64_t{s.allocations ? 1u : 0u});
}

void runs_of(PromText& out, const DoctorRuns& runs) {
  out.family("gpufence_doctor_runs_total", "counter", "Runs of the doctor.");
  out.sample("gpufence_doctor_runs_total", {}, runs.runs);
  out.family("gpufence_doctor_last_run_timestamp_seconds", "gauge",
             "When the last run finished, Unix seconds.");
  out.sample("gpufence_doctor_last_run_timestamp_seconds", {},
             std::chrono::duration<double>(runs.last_run.time_since_epoch()).count());
  out.family("gpufence_doctor_run_duration_seconds", "gauge", "How long the last run took.");
  out.sample("gpufence_doctor_run_duration_seconds", {}, runs.last_duration.count());
}

}  // namespace

std::string render_doctor_metrics(const Snapshot& s, const std::vector<Finding>& findings,
                                  const DoctorRuns& runs) {
  PromText out;
  container_access(out, s);
  finding_counts(out, findings);
  nri_state(out, s);
  sources_of(out, s);
  runs_of(out, runs);
  return out.take();
}

}  // namespace gpufence
