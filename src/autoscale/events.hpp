// Kubernetes Events for the autoscaler's decisions, so `kubectl describe deployment` and `kubectl
// events` show why replicas changed: events.k8s.io/v1 Events POSTed into the Deployment's
// namespace (docs/autoscale.md, "Events").
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "autoscale/capacity.hpp"
#include "common/error.hpp"
#include "kube/client.hpp"
#include "kube/events.hpp"

namespace gpufence {

// The reportingController of the autoscaler's Events.
inline constexpr std::string_view kAutoscaleEventController = "gpufence.io/autoscale";

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
