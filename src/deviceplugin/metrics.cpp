#include "deviceplugin/metrics.hpp"

#include "common/error.hpp"
#include "common/prometheus.hpp"
#include "common/strings.hpp"

namespace gpufence {

namespace {

// Whether a kubelet device id names this GPU (the plugin's ids are UUIDs or indices).
bool names(const std::string& id, const Gpu& g) {
  return id == g.uuid || id == std::to_string(g.index);
}

PromLabels gpu_labels(const std::string& resource, const Gpu& g) {
  return {{"resource", resource},
          {"gpu", std::to_string(g.index)},
          {"UUID", g.uuid},
          {"device", cat("nvidia", g.minor)},
          {"modelName", g.name}};
}

}  // namespace

std::string render_gpu_metrics(
    const std::string& resource, const std::vector<GpuMetricRow>& rows,
    const std::optional<Result<std::vector<KubeletAllocation>>>& holders) {
  PromText out;
  out.family("gpufence_gpu_info", "gauge",
             "One series per GPU and container holding it (namespace, pod, container from the "
             "kubelet's PodResources; empty when the GPU is free).");
  for (const auto& r : rows) {
    if (r.health.uuid.empty()) continue;
    bool held = false;
    if (holders && *holders) {
      for (const auto& a : **holders) {
        for (const auto& id : a.device_ids) {
          if (!names(id, r.gpu)) continue;
          auto labels = gpu_labels(resource, r.gpu);
          labels.insert(
              labels.end(),
              {{"namespace", a.pod_namespace}, {"pod", a.pod}, {"container", a.container}});
          out.sample("gpufence_gpu_info", labels, std::uint64_t{1});
          held = true;
          break;
        }
      }
    }
    if (held) continue;
    auto labels = gpu_labels(resource, r.gpu);
    labels.insert(labels.end(), {{"namespace", ""}, {"pod", ""}, {"container", ""}});
    out.sample("gpufence_gpu_info", labels, std::uint64_t{1});
  }
  if (holders) {
    out.family("gpufence_pod_resources_up", "gauge",
               "The kubelet's PodResources answered the last scrape (1): the holders are known.");
    out.sample("gpufence_pod_resources_up", {{"resource", resource}},
               std::uint64_t{*holders ? 1u : 0u});
  }
  out.family("gpufence_gpu_healthy", "gauge",
             "1 while the GPU is Healthy for the kubelet, 0 while Unhealthy.");
  for (const auto& r : rows)
    if (!r.health.uuid.empty())
      out.sample("gpufence_gpu_healthy", gpu_labels(resource, r.gpu),
                 std::uint64_t{r.health.healthy ? 1u : 0u});
  out.family("gpufence_gpu_xid_errors_total", "counter",
             "XIDs the driver reported, by code, ignored ones too (UUID empty: tied to no GPU).");
  for (const auto& r : rows) {
    for (const auto& [xid, n] : r.health.xids) {
      PromLabels labels = {{"resource", resource},
                           {"gpu", r.health.uuid.empty() ? "" : std::to_string(r.gpu.index)},
                           {"UUID", r.health.uuid},
                           {"xid", std::to_string(xid)}};
      out.sample("gpufence_gpu_xid_errors_total", labels, n);
    }
  }
  out.family("gpufence_gpu_health_transitions_total", "counter",
             "Health changes of the GPU, by the health it changed to.");
  for (const auto& r : rows) {
    if (r.health.uuid.empty()) continue;
    for (auto [to, n] : {std::pair{"Healthy", r.health.to_healthy},
                         std::pair{"Unhealthy", r.health.to_unhealthy}}) {
      out.sample("gpufence_gpu_health_transitions_total",
                 {{"resource", resource},
                  {"gpu", std::to_string(r.gpu.index)},
                  {"UUID", r.health.uuid},
                  {"to", to}},
                 n);
    }
  }
  out.family("gpufence_gpu_recovery_action", "gauge",
             "1 on the recovery action the driver asks for the GPU (none, gpu_reset, "
             "node_reboot, drain_p2p, drain_and_reset, other); absent where the driver has none.");
  for (const auto& r : rows) {
    if (r.health.uuid.empty() || !r.health.action) continue;
    out.sample("gpufence_gpu_recovery_action",
               {{"resource", resource},
                {"gpu", std::to_string(r.gpu.index)},
                {"UUID", r.health.uuid},
                {"action", std::string(recovery_action_name(*r.health.action))}},
               std::uint64_t{1});
  }
  return out.take();
}

void PluginMetrics::observe_allocate(std::chrono::nanoseconds duration, bool ok,
                                     size_t containers) {
  double seconds = std::chrono::duration<double>(duration).count();
  {
    std::lock_guard lock(m_mutex);
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      if (seconds <= kBuckets[i]) ++m_bucket_counts[i];
    }
    ++m_allocate_count;
    m_allocate_sum += seconds;
  }
  if (ok)
    m_allocations += containers;
  else
    ++m_allocate_errors;
}

std::optional<Result<std::vector<KubeletAllocation>>> PluginMetrics::held() const {
  GpuHolders holders;
  {
    std::lock_guard lock(m_mutex);
    holders = m_holders;
  }
  if (!holders) return std::nullopt;
  // One scrape asks; one that finds another asking takes the last answer (none yet: unknown).
  std::unique_lock ask(m_held_mutex, std::try_to_lock);
  if (!ask.owns_lock()) {
    std::lock_guard lock(m_mutex);
    if (m_held) return m_held;
    return Result<std::vector<KubeletAllocation>>(
        fail(Errc::rpc, "PodResources: another scrape is asking the kubelet"));
  }
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(m_mutex);
    if (m_held && now - m_held_at < kHoldersMaxAge) return m_held;
  }
  // The kubelet is asked with only m_held_mutex held: a slow PodResources delays this scrape and
  // none of Allocate, ListAndWatch or the health monitor.
  auto answer = holders();
  std::lock_guard lock(m_mutex);
  m_held = std::move(answer);
  m_held_at = now;
  return m_held;
}

std::string PluginMetrics::render(const std::string& resource) const {
  std::string r = "resource=\"" + resource + "\"";
  std::string out;
  out +=
      "# HELP gpufence_devices Devices advertised to the kubelet, by health.\n# TYPE "
      "gpufence_devices gauge\n";
  out += cat("gpufence_devices{", r, ",health=\"Healthy\"} ", m_healthy.load(), "\n");
  out += cat("gpufence_devices{", r, ",health=\"Unhealthy\"} ", m_unhealthy.load(), "\n");
  out +=
      "# HELP gpufence_allocations_total Containers given devices by Allocate.\n# TYPE "
      "gpufence_allocations_total counter\n";
  out += cat("gpufence_allocations_total{", r, "} ", m_allocations.load(), "\n");
  out +=
      "# HELP gpufence_allocate_errors_total Allocate calls refused.\n# TYPE "
      "gpufence_allocate_errors_total counter\n";
  out += cat("gpufence_allocate_errors_total{", r, "} ", m_allocate_errors.load(), "\n");
  out +=
      "# HELP gpufence_registrations_total Successful registrations with the kubelet.\n# TYPE "
      "gpufence_registrations_total counter\n";
  out += cat("gpufence_registrations_total{", r, "} ", m_registrations.load(), "\n");
  out +=
      "# HELP gpufence_kubelet_restarts_total Kubelet restarts seen (kubelet.sock re-created).\n# "
      "TYPE gpufence_kubelet_restarts_total counter\n";
  out += cat("gpufence_kubelet_restarts_total{", r, "} ", m_kubelet_restarts.load(), "\n");
  out +=
      "# HELP gpufence_allocate_duration_seconds Allocate handling time.\n# TYPE "
      "gpufence_allocate_duration_seconds histogram\n";
  std::unique_lock lock(m_mutex);
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    out += cat("gpufence_allocate_duration_seconds_bucket{", r, ",le=\"", kBuckets[i], "\"} ",
               m_bucket_counts[i], "\n");
  }
  out += cat("gpufence_allocate_duration_seconds_bucket{", r, ",le=\"+Inf\"} ", m_allocate_count,
             "\n");
  out += cat("gpufence_allocate_duration_seconds_sum{", r, "} ", m_allocate_sum, "\n");
  out += cat("gpufence_allocate_duration_seconds_count{", r, "} ", m_allocate_count, "\n");
  GpuRows rows = m_rows;
  lock.unlock();
  if (rows) out += render_gpu_metrics(resource, rows(), held());
  return out;
}

}  // namespace gpufence
