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

// The Event's metadata.name, as client-go's recorder names one (`<regarding name>.<hex of t in
// Unix nanoseconds>`): always a valid DNS-1123 subdomain, whatever `object_name` holds. A name
// that is not one already (no API server stores such a Deployment, but the value is not trusted
// here) is lowercased, every other byte outside [a-z0-9.-] becomes '-', labels are trimmed to
// start and end alphanumeric, empty ones dropped, and the whole is cut to fit 253 characters;
// nothing left gives "gpufence". (A generateName of "<name>." is refused with 422: the API server
// validates the prefix itself as a subdomain, and one ending in '.' is not.)
std::string event_name(std::string_view object_name, std::chrono::system_clock::time_point t);

// The Event object for `event` about `deployment` (the API's validation: eventTime, action,
// reportingController and reportingInstance are required for new events.k8s.io/v1 Events).
nlohmann::json scale_event_object(const DeploymentView& deployment, const EventSource& source,
                                  const ScaleEvent& event, std::chrono::system_clock::time_point t);
Status post_scale_event(KubeClient& kube, const DeploymentView& deployment,
                        const EventSource& source, const ScaleEvent& event);

}  // namespace gpufence
