// Kubernetes Events for the autoscaler's decisions, so `kubectl describe deployment` and `kubectl
// events` show why replicas changed: events.k8s.io/v1 Events POSTed into the Deployment's
// namespace (docs/autoscale.md, "Events").
#pragma once

#include <chrono>
#include <string>

#include "autoscale/capacity.hpp"
#include "common/error.hpp"
#include "kube/client.hpp"

namespace gpufence {

// metav1.MicroTime as the API writes it: RFC 3339 in UTC with microseconds.
std::string micro_time(std::chrono::system_clock::time_point t);

struct EventSource {
  std::string controller = "gpufence.io/autoscale";  // reportingController: a qualified name
  std::string instance;                              // reportingInstance: this replica
};

struct ScaleEvent {
  std::string type = "Normal";  // Normal or Warning
  std::string reason;           // ScaledUp, ScaledDown, ... (at most 128 characters)
  std::string note;             // the decision in words (at most 1 kB; longer is cut)
};

// The Event object for `event` about `deployment` (the API's validation: eventTime, action,
// reportingController and reportingInstance are required for new events.k8s.io/v1 Events).
nlohmann::json scale_event_object(const DeploymentView& deployment, const EventSource& source,
                                  const ScaleEvent& event, std::chrono::system_clock::time_point t);
Status post_scale_event(KubeClient& kube, const DeploymentView& deployment,
                        const EventSource& source, const ScaleEvent& event);

}  // namespace gpufence
