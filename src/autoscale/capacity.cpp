#include "autoscale/capacity.hpp"

#include <algorithm>

#include "common/strings.hpp"
#include "kube/client.hpp"

namespace gpufence {
namespace {

using json = nlohmann::json;

std::string str(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
}

const json& field(const json& o, const char* key) {
  static const json null;
  return o.is_object() && o.contains(key) ? o[key] : null;
}

json array_or_empty(const json& o, const char* key) {
  const json& v = field(o, key);
  return v.is_array() ? v : json::array();
}

// requests, else limits: for extended resources the API makes requests equal limits.
long container_request(const json& container, const std::string& resource) {
  const json& res = field(container, "resources");
  const json& requests = field(res, "requests");
  if (requests.is_object() && requests.contains(resource))
    return resource_quantity(requests, resource);
  return resource_quantity(field(res, "limits"), resource);
}

bool is_sidecar(const json& init_container) {
  return str(init_container, "restartPolicy") == "Always";
}

}  // namespace

bool tolerates(const json& toleration, const json& taint) {
  std::string effect = str(toleration, "effect");
  if (!effect.empty() && effect != str(taint, "effect")) return false;
  std::string key = str(toleration, "key");
  if (!key.empty() && key != str(taint, "key")) return false;
  std::string op = str(toleration, "operator");
  if (op.empty() || op == "Equal") return str(toleration, "value") == str(taint, "value");
  if (op == "Exists") return true;
  return false;
}

std::optional<json> untolerated_taint(const json& tolerations, const json& taints) {
  if (!taints.is_array()) return std::nullopt;
  for (const auto& taint : taints) {
    std::string effect = str(taint, "effect");
    if (effect != "NoSchedule" && effect != "NoExecute") continue;
    bool tolerated = false;
    if (tolerations.is_array()) {
      for (const auto& t : tolerations) tolerated = tolerated || tolerates(t, taint);
    }
    if (!tolerated) return taint;
  }
  return std::nullopt;
}

long effective_request(const json& pod_spec, const std::string& resource) {
  long containers = 0;
  for (const auto& c : array_or_empty(pod_spec, "containers"))
    containers += container_request(c, resource);
  long sidecars = 0, init_peak = 0;
  for (const auto& c : array_or_empty(pod_spec, "initContainers")) {
    long request = container_request(c, resource);
    if (is_sidecar(c)) {
      // A sidecar keeps running beside the containers, and beside every init container after it.
      containers += request;
      sidecars += request;
      init_peak = std::max(init_peak, sidecars);
    } else {
      init_peak = std::max(init_peak, request + sidecars);
    }
  }
  return std::max(containers, init_peak) + resource_quantity(field(pod_spec, "overhead"), resource);
}

bool selector_matches(const json& selector, const json& labels) {
  auto label = [&](const std::string& k) -> std::optional<std::string> {
    if (labels.is_object() && labels.contains(k) && labels[k].is_string())
      return labels[k].get<std::string>();
    return std::nullopt;
  };
  const json& match_labels = field(selector, "matchLabels");
  if (match_labels.is_object()) {
    for (const auto& [k, v] : match_labels.items()) {
      if (!v.is_string() || label(k) != v.get<std::string>()) return false;
    }
  }
  for (const auto& e : array_or_empty(selector, "matchExpressions")) {
    std::string op = str(e, "operator");
    auto have = label(str(e, "key"));
    std::vector<std::string> values;
    for (const auto& v : array_or_empty(e, "values"))
      if (v.is_string()) values.push_back(v.get<std::string>());
    bool listed = have && std::find(values.begin(), values.end(), *have) != values.end();
    if (op == "In" && !listed) return false;
    if (op == "NotIn" && listed) return false;
    if (op == "Exists" && !have) return false;
    if (op == "DoesNotExist" && have) return false;
    if (op != "In" && op != "NotIn" && op != "Exists" && op != "DoesNotExist") return false;
  }
  return true;
}

Result<DeploymentView> deployment_view(const json& deployment, const std::string& resource) {
  DeploymentView d;
  const json& meta = field(deployment, "metadata");
  const json& spec = field(deployment, "spec");
  d.ns = str(meta, "namespace");
  d.name = str(meta, "name");
  d.uid = str(meta, "uid");
  // spec.replicas defaults to 1 when unset (apps/v1 defaulting).
  const json& replicas = field(spec, "replicas");
  d.replicas = replicas.is_number_integer() ? replicas.get<long>() : 1;
  d.selector = field(spec, "selector");
  const json& pod_spec = field(field(spec, "template"), "spec");
  d.pod.gpus = effective_request(pod_spec, resource);
  if (d.pod.gpus <= 0) {
    return fail(Errc::invalid_argument, "Deployment ", d.ns, "/", d.name,
                ": its pod template requests no ", resource,
                " (spec.template.spec.containers[*].resources); nothing for GPU capacity to bound");
  }
  d.pod.tolerations = array_or_empty(pod_spec, "tolerations");
  const json& selector = field(pod_spec, "nodeSelector");
  if (selector.is_object()) {
    for (const auto& [k, v] : selector.items())
      if (v.is_string()) d.pod.node_selector[k] = v.get<std::string>();
  }
  return d;
}

std::optional<std::string> why_unschedulable(const json& node, const PodTemplate& pod) {
  const json& spec = field(node, "spec");
  if (field(spec, "unschedulable").is_boolean() && field(spec, "unschedulable").get<bool>())
    return "cordoned (spec.unschedulable)";
  std::string ready = "Unknown";
  for (const auto& c : array_or_empty(field(node, "status"), "conditions")) {
    if (str(c, "type") == "Ready") ready = str(c, "status");
  }
  if (ready != "True") return "not Ready (" + ready + ")";
  const json& labels = field(field(node, "metadata"), "labels");
  for (const auto& [k, v] : pod.node_selector) {
    if (!labels.is_object() || !labels.contains(k) || labels[k] != v)
      return "lacks label " + k + "=" + v + " (nodeSelector)";
  }
  if (auto taint = untolerated_taint(pod.tolerations, field(spec, "taints"))) {
    return cat("taint ", str(*taint, "key"), str(*taint, "value").empty() ? "" : "=",
               str(*taint, "value"), ":", str(*taint, "effect"), " not tolerated");
  }
  return std::nullopt;
}

Capacity free_capacity(const std::vector<json>& nodes, const std::vector<json>& pods,
                       const DeploymentView& deployment, const std::string& resource) {
  Capacity out;
  std::map<std::string, long> used;  // by node name
  long existing = 0;                 // the Deployment's pods, not being deleted
  for (const auto& p : pods) {
    const json& meta = field(p, "metadata");
    const json& spec = field(p, "spec");
    std::string phase = str(field(p, "status"), "phase");
    if (phase == "Succeeded" || phase == "Failed") continue;
    long request = effective_request(spec, resource);
    std::string node = str(spec, "nodeName");
    // A terminating pod holds its GPUs until it is gone, but its replacement is already asked.
    if (node.empty())
      out.pending_gpus += request;
    else
      used[node] += request;
    if (str(meta, "namespace") == deployment.ns && !meta.contains("deletionTimestamp") &&
        selector_matches(deployment.selector, field(meta, "labels")))
      ++existing;
  }
  out.not_created = std::max(0L, deployment.replicas - existing);
  const long per_pod = std::max(1L, deployment.pod.gpus);
  long whole_pods = 0;
  for (const auto& n : nodes) {
    ++out.nodes;
    std::string name = str(field(n, "metadata"), "name");
    if (auto why = why_unschedulable(n, deployment.pod)) {
      out.skipped.push_back(name + ": " + *why);
      continue;
    }
    ++out.schedulable_nodes;
    long allocatable = resource_quantity(field(field(n, "status"), "allocatable"), resource);
    whole_pods += std::max(0L, allocatable - used[name]) / per_pod;
  }
  out.free_gpus = std::max(0L, whole_pods * per_pod - out.pending_gpus - out.not_created * per_pod);
  return out;
}

json project_pod(const json& pod) {
  const json& meta = field(pod, "metadata");
  const json& spec = field(pod, "spec");
  json m{{"name", str(meta, "name")},
         {"namespace", str(meta, "namespace")},
         {"resourceVersion", str(meta, "resourceVersion")}};
  if (field(meta, "labels").is_object()) m["labels"] = meta["labels"];
  if (meta.is_object() && meta.contains("deletionTimestamp"))
    m["deletionTimestamp"] = meta["deletionTimestamp"];
  auto resources_only = [](const json& list, bool keep_restart_policy) {
    json out = json::array();
    if (!list.is_array()) return out;
    for (const auto& c : list) {
      json kept{
          {"resources", c.is_object() ? c.value("resources", json::object()) : json::object()}};
      if (keep_restart_policy && !str(c, "restartPolicy").empty())
        kept["restartPolicy"] = str(c, "restartPolicy");
      out.push_back(std::move(kept));
    }
    return out;
  };
  json s{{"nodeName", str(spec, "nodeName")},
         {"containers", resources_only(field(spec, "containers"), false)},
         {"initContainers", resources_only(field(spec, "initContainers"), true)}};
  if (field(spec, "overhead").is_object()) s["overhead"] = spec["overhead"];
  return {
      {"metadata", m}, {"spec", s}, {"status", {{"phase", str(field(pod, "status"), "phase")}}}};
}

json project_node(const json& node) {
  const json& meta = field(node, "metadata");
  const json& spec = field(node, "spec");
  const json& status = field(node, "status");
  json conditions = json::array();
  for (const auto& c : array_or_empty(status, "conditions"))
    conditions.push_back({{"type", str(c, "type")}, {"status", str(c, "status")}});
  json s = json::object();
  if (field(spec, "unschedulable").is_boolean()) s["unschedulable"] = spec["unschedulable"];
  if (field(spec, "taints").is_array()) s["taints"] = spec["taints"];
  return {{"metadata",
           {{"name", str(meta, "name")},
            {"resourceVersion", str(meta, "resourceVersion")},
            {"labels", field(meta, "labels").is_object() ? meta["labels"] : json::object()}}},
          {"spec", s},
          {"status",
           {{"allocatable",
             field(status, "allocatable").is_object() ? status["allocatable"] : json::object()},
            {"conditions", conditions}}}};
}

}  // namespace gpufence
