#include "autoscale/events.hpp"

namespace gpufence {

namespace {

EventRegarding regarding(const DeploymentView& deployment) {
  return {"apps/v1", "Deployment", deployment.ns, deployment.name, deployment.uid};
}

KubeEvent kube_event(const ScaleEvent& event) {
  return {event.type, "Scale", event.reason, event.note};
}

}  // namespace

nlohmann::json scale_event_object(const DeploymentView& deployment, const EventSource& source,
                                  const ScaleEvent& event,
                                  std::chrono::system_clock::time_point t) {
  return event_object(regarding(deployment), source, kube_event(event), t);
}

Status post_scale_event(KubeClient& kube, const DeploymentView& deployment,
                        const EventSource& source, const ScaleEvent& event) {
  return post_event(kube, regarding(deployment), source, kube_event(event));
}

}  // namespace gpufence
