#include "deviceplugin/metrics.hpp"

#include "common/error.hpp"
#include "common/strings.hpp"

namespace gpufence {

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
  std::lock_guard lock(m_mutex);
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    out += cat("gpufence_allocate_duration_seconds_bucket{", r, ",le=\"", kBuckets[i], "\"} ",
               m_bucket_counts[i], "\n");
  }
  out += cat("gpufence_allocate_duration_seconds_bucket{", r, ",le=\"+Inf\"} ", m_allocate_count,
             "\n");
  out += cat("gpufence_allocate_duration_seconds_sum{", r, "} ", m_allocate_sum, "\n");
  out += cat("gpufence_allocate_duration_seconds_count{", r, "} ", m_allocate_count, "\n");
  return out;
}

}  // namespace gpufence
