// How many of a resource a pod requests, the one answer the autoscaler and the doctor share.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.hpp"

namespace gpufence {

// A pod's effective request of `resource` as the scheduler counts it (k8s.io/component-helpers
// resource.PodRequests, KEP-753 for sidecars): the containers' sum plus restartable init
// containers (restartPolicy: Always, sidecars, which keep running); at least the largest
// regular init container plus the sidecars started before it; plus spec.overhead. A container's
// request is its requests entry, else its limits entry (the API defaults requests to limits).
// Sums saturate at LONG_MAX; a quantity that does not parse is an error naming the container.
Result<long> effective_request(const nlohmann::json& pod_spec, const std::string& resource);

}  // namespace gpufence
