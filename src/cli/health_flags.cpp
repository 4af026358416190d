#include "cli/health_flags.hpp"

#include <cstdlib>

namespace gpufence::cli {

void add_health_flags(CLI::App& app, HealthFlags& f) {
  app.add_flag("--disable-health-checks", f.disable,
               "Never mark GPUs Unhealthy (also: DP_DISABLE_HEALTHCHECKS=all)");
  f.ignore = app.add_option("--ignore-xids", f.ignore_xids,
                            "XIDs that do not make a GPU Unhealthy, replacing the default "
                            "application-level list 13,31,43,45,68,109 (\"\" for none: every "
                            "XID counts)");
  app.add_option("--permanent-xids", f.permanent_xids,
                 "XIDs after which a GPU stays Unhealthy until the process restarts, whatever "
                 "--health-recovery says (\"\" for none)")
      ->capture_default_str();
  app.add_option("--health-recovery", f.recovery,
                 "Mark an XID-Unhealthy GPU Healthy again after this long without a new critical "
                 "XID (e.g. 10m); off by default")
      ->capture_default_str();
}

Result<HealthOptions> health_options(const HealthFlags& f) {
  HealthOptions h;
  auto rec = parse_duration(f.recovery);
  if (!rec) return std::unexpected(rec.error().wrap("--health-recovery"));
  h.recovery = *rec;
  if (f.ignore && f.ignore->count() > 0) {
    auto xids = parse_xid_list(f.ignore_xids);
    if (!xids) return std::unexpected(xids.error().wrap("--ignore-xids"));
    h.ignored_xids = *xids;
  }
  auto permanent = parse_xid_list(f.permanent_xids);
  if (!permanent) return std::unexpected(permanent.error().wrap("--permanent-xids"));
  h.permanent_xids = *permanent;
  bool disable = f.disable;
  if (const char* dp = std::getenv("DP_DISABLE_HEALTHCHECKS"); dp && *dp) {
    std::string v = dp;
    if (v == "all" || v == "xids") {
      disable = true;
    } else {
      auto extra = parse_xid_list(v);
      if (!extra) return std::unexpected(extra.error().wrap("DP_DISABLE_HEALTHCHECKS"));
      h.ignored_xids.insert(extra->begin(), extra->end());
    }
  }
  h.enabled = !disable;
  return h;
}

}  // namespace gpufence::cli
