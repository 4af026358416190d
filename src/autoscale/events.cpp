#include "autoscale/events.hpp"

#include "common/utc_time.hpp"

namespace gpufence {

std::string micro_time(std::chrono::system_clock::time_point t) {
  return utc_rfc3339(t, SubSecond::micros);
}

nlohmann::json scale_event_object(const DeploymentView& deployment, const EventSource& source,
                                  const ScaleEvent& event,
                                  std::chrono::system_clock::time_point t) {
  std::string note = event.note.size() > 1024 ? event.note.substr(0, 1021) + "..." : event.note;
  nlohmann::json regarding{{"apiVersion", "apps/v1"},
                           {"kind", "Deployment"},
                           {"namespace", deployment.ns},
                           {"name", deployment.name}};
  if (!deployment.uid.empty()) regarding["uid"] = deployment.uid;
  return {{"apiVersion", "events.k8s.io/v1"},
          {"kind", "Event"},
          {"metadata", {{"generateName", deployment.name + "."}, {"namespace", deployment.ns}}},
          {"eventTime", micro_time(t)},
          {"reportingController", source.controller},
          {"reportingInstance", source.instance.substr(0, 128)},
          {"action", "Scale"},
          {"reason", event.reason.substr(0, 128)},
          {"note", note},
          {"type", event.type},
          {"regarding", regarding}};
}

Status post_scale_event(KubeClient& kube, const DeploymentView& deployment,
                        const EventSource& source, const ScaleEvent& event) {
  auto body = scale_event_object(deployment, source, event, std::chrono::system_clock::now());
  auto answer = kube.request(
      "POST", "/apis/events.k8s.io/v1/namespaces/" + deployment.ns + "/events", body.dump());
  if (!answer) return std::unexpected(answer.error().wrap("record event"));
  return {};
}

}  // namespace gpufence
