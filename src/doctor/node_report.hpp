// The doctor's findings where operators look (docs/monitoring.md, "Node condition and Events"):
// a Node condition `GPUIsolation` (True: the doctor found no error; False: it did, the message
// naming them) set as node-problem-detector sets its conditions, by a strategic merge patch of
// the Node's status that leaves the kubelet's own conditions alone; and an events.k8s.io/v1 Event
// on the pod each new error or warning names (on the Node where it names none), so `kubectl
// describe node` and `kubectl get events` show them.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/finding.hpp"
#include "kube/client.hpp"
#include "kube/events.hpp"

namespace gpufence {

inline constexpr std::string_view kIsolationCondition = "GPUIsolation";
inline constexpr std::string_view kDoctorEventController = "gpufence.io/doctor";
// The most Events one run posts: a node with a hundred leaking containers says so on the Node
// condition, and does not flood the API server.
inline constexpr size_t kMaxEventsPerRun = 20;

struct NodeCondition {
  std::string type = std::string(kIsolationCondition);
  std::string status;  // "True" or "False"
  std::string reason;  // CamelCase
  std::string message;
};

// True when no finding is an error; else False naming the errors (bounded, escaped). Unknown
// when the kubelet's allocations could not be read (`allocations_known` false) and no error was
// found: what each container may open was not compared with anything.
NodeCondition isolation_condition(const std::vector<Finding>& findings,
                                  bool allocations_known = true);

// The patch body: the condition with lastHeartbeatTime `now`, and lastTransitionTime `now`
// unless `node`'s current condition of that type has the same status (then its own time).
nlohmann::json condition_patch(const nlohmann::json& node, const NodeCondition& condition,
                               std::chrono::system_clock::time_point now);
// GET the Node, PATCH its status with condition_patch.
Status set_node_condition(KubeClient& kube, const std::string& node,
                          const NodeCondition& condition);

// An Event's reason from a finding id: "gpu.open-unallocated" -> "GpuOpenUnallocated".
std::string event_reason(std::string_view finding_id);

// Posts an Event for each error or warning that was not there at the previous call (a finding
// that goes away and comes back is told again), at most kMaxEventsPerRun per call; the first call
// tells every one. Pod findings go to the pod, the others to the Node.
class FindingEvents {
 public:
  FindingEvents(std::string node, EventSource source)
      : m_node(std::move(node)), m_source(std::move(source)) {}
  // The Events that failed to post are named in the error; the others were posted.
  Status post_new(KubeClient& kube, const std::vector<Finding>& findings);
  // The condition's status changed: an Event on the Node saying so.
  Status post_condition_change(KubeClient& kube, const NodeCondition& condition);

 private:
  std::string m_node;
  EventSource m_source;
  std::set<std::string> m_seen;
};

}  // namespace gpufence
