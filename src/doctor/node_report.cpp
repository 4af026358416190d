#include "doctor/node_report.hpp"

#include <cctype>

#include "common/escape.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "kube/events.hpp"

namespace gpufence {

namespace {

constexpr size_t kMaxMessageBytes = 1024;

// metav1.Time: RFC 3339, whole seconds, UTC.
std::string timestamp(std::chrono::system_clock::time_point t) {
  return utc_rfc3339(t, SubSecond::none);
}

EventRegarding node_ref(const std::string& node) {
  return {"v1", "Node", "", node, ""};
}

}  // namespace

NodeCondition isolation_condition(const std::vector<Finding>& findings, bool allocations_known) {
  std::vector<std::string> errors;
  size_t warnings = 0;
  for (const auto& f : findings) {
    if (f.severity == Severity::error)
      errors.push_back(cat("[", f.id, "] ", f.summary));
    else if (f.severity == Severity::warning)
      ++warnings;
  }
  if (errors.empty() && !allocations_known)
    return {std::string(kIsolationCondition), "Unknown", "AllocationsUnknown",
            "gpufence doctor could not read the kubelet's PodResources: what each container can "
            "open was not compared with its allocation"};
  if (errors.empty())
    return {std::string(kIsolationCondition), "True", "NoErrorFindings",
            cat("gpufence doctor found no error (", warnings, " warnings)")};
  std::string message =
      cat("gpufence doctor found ", errors.size(), " errors: ", join(errors, "; "));
  return {std::string(kIsolationCondition), "False", "ErrorFindings",
          escape_excerpt(message, kMaxMessageBytes)};
}

nlohmann::json condition_patch(const nlohmann::json& node, const NodeCondition& condition,
                               std::chrono::system_clock::time_point now) {
  std::string transition = timestamp(now);
  if (node.is_object() && node.contains("status") && node["status"].is_object() &&
      node["status"].contains("conditions") && node["status"]["conditions"].is_array()) {
    for (const auto& c : node["status"]["conditions"]) {
      if (!c.is_object() || c.value("type", "") != condition.type) continue;
      if (c.value("status", "") == condition.status && c.contains("lastTransitionTime") &&
          c["lastTransitionTime"].is_string())
        transition = c["lastTransitionTime"].get<std::string>();
    }
  }
  return {{"status",
           {{"conditions", nlohmann::json::array({{{"type", condition.type},
                                                   {"status", condition.status},
                                                   {"reason", condition.reason},
                                                   {"message", condition.message},
                                                   {"lastHeartbeatTime", timestamp(now)},
                                                   {"lastTransitionTime", transition}}})}}}};
}

Status set_node_condition(KubeClient& kube, const std::string& node,
                          const NodeCondition& condition) {
  const std::string path = "/api/v1/nodes/" + node;
  auto current = kube.get(path);
  if (!current) return std::unexpected(current.error().wrap("read the Node"));
  auto body = condition_patch(*current, condition, std::chrono::system_clock::now())
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  auto answer = kube.request("PATCH", path + "/status", body);
  if (!answer) return std::unexpected(answer.error().wrap("set the Node condition"));
  return {};
}

std::string event_reason(std::string_view finding_id) {
  std::string out;
  bool upper = true;
  for (char c : finding_id) {
    if (!std::isalnum(static_cast<unsigned char>(c))) {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out.empty() ? std::string("Finding") : out.substr(0, 128);
}

Status FindingEvents::post_new(KubeClient& kube, const std::vector<Finding>& findings) {
  // What is told now: the findings told before that are still there, and those posted now. One
  // past the limit or whose Event failed stays untold, so the next run tries again.
  std::set<std::string> told;
  std::vector<std::string> failed;
  size_t posted = 0;
  for (const auto& f : findings) {
    if (f.severity == Severity::info) continue;
    std::string key = cat(f.id, "\n", f.pod, "\n", f.summary);
    if (m_seen.contains(key)) {
      told.insert(key);
      continue;
    }
    if (posted >= kMaxEventsPerRun) continue;
    EventRegarding about = node_ref(m_node);
    if (auto slash = f.pod.find('/'); slash != std::string::npos)
      about = {"v1", "Pod", f.pod.substr(0, slash), f.pod.substr(slash + 1), ""};
    KubeEvent event{f.severity == Severity::error ? "Warning" : "Normal", "Diagnose",
                    event_reason(f.id),
                    escape_excerpt(cat(f.summary, ". Fix: ", f.fix), kMaxMessageBytes)};
    ++posted;
    if (auto st = post_event(kube, about, m_source, event); st)
      told.insert(std::move(key));
    else
      failed.push_back(st.error().message);
  }
  m_seen = std::move(told);
  if (!failed.empty())
    return fail(Errc::rpc, failed.size(), " Events not posted: ", failed.front());
  return {};
}

Status FindingEvents::post_condition_change(KubeClient& kube, const NodeCondition& condition) {
  KubeEvent event{condition.status == "True" ? "Normal" : "Warning", "Diagnose",
                  condition.status == "True" ? "GPUIsolationRestored" : "GPUIsolationLost",
                  condition.message};
  return post_event(kube, node_ref(m_node), m_source, event);
}

}  // namespace gpufence
