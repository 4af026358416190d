#include "kube/pod_request.hpp"

#include <algorithm>

#include "common/saturating.hpp"
#include "common/strings.hpp"
#include "kube/quantity.hpp"

namespace gpufence {
namespace {

using json = nlohmann::json;

const json& field(const json& o, const char* key) {
  static const json null;
  return o.is_object() && o.contains(key) ? o[key] : null;
}

std::string str(const json& o, const char* key) {
  const json& v = field(o, key);
  return v.is_string() ? v.get<std::string>() : "";
}

json array_or_empty(const json& o, const char* key) {
  const json& v = field(o, key);
  return v.is_array() ? v : json::array();
}

// requests, else limits: for extended resources the API makes requests equal limits.
Result<long> container_request(const json& container, const std::string& resource) {
  const json& res = field(container, "resources");
  const json& requests = field(res, "requests");
  const bool requested = requests.is_object() && requests.contains(resource);
  auto n = resource_count(requested ? requests : field(res, "limits"), resource);
  if (!n)
    return std::unexpected(n.error().wrap(cat("container '", str(container, "name"), "' resources.",
                                              requested ? "requests" : "limits")));
  return n;
}

bool is_sidecar(const json& init_container) {
  return str(init_container, "restartPolicy") == "Always";
}

}  // namespace

Result<long> effective_request(const json& pod_spec, const std::string& resource) {
  long containers = 0;
  for (const auto& c : array_or_empty(pod_spec, "containers")) {
    auto request = container_request(c, resource);
    if (!request) return std::unexpected(request.error());
    containers = sat_add(containers, *request);
  }
  long sidecars = 0, init_peak = 0;
  for (const auto& c : array_or_empty(pod_spec, "initContainers")) {
    auto request = container_request(c, resource);
    if (!request) return std::unexpected(request.error().wrap("init"));
    if (is_sidecar(c)) {
      // A sidecar keeps running beside the containers, and beside every init container after it.
      containers = sat_add(containers, *request);
      sidecars = sat_add(sidecars, *request);
      init_peak = std::max(init_peak, sidecars);
    } else {
      init_peak = std::max(init_peak, sat_add(*request, sidecars));
    }
  }
  auto overhead = resource_count(field(pod_spec, "overhead"), resource);
  if (!overhead) return std::unexpected(overhead.error().wrap("spec.overhead"));
  return sat_add(std::max(containers, init_peak), *overhead);
}

}  // namespace gpufence
