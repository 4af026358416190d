#include "autoscale/capacity.hpp"

#include <algorithm>
#include <climits>
#include <set>

#include "common/saturating.hpp"
#include "common/strings.hpp"
#include "kube/quantity.hpp"

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

// strconv.ParseInt(s, 10, 64) as labels.Requirement.Matches uses it for Gt and Lt: an optional
// sign, then decimal digits, in range.
std::optional<long> go_parse_int64(std::string_view s) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty() || s[0] == '+') return std::nullopt;
  return parse_number<long>(s);  // from_chars takes a leading '-' and checks the range
}

std::vector<std::string> string_values(const json& requirement, bool& all_strings) {
  std::vector<std::string> out;
  for (const auto& v : array_or_empty(requirement, "values")) {
    if (v.is_string())
      out.push_back(v.get<std::string>());
    else
      all_strings = false;
  }
  return out;
}

// One NodeSelectorRequirement of matchExpressions; nullopt when it does not parse
// (labels.NewRequirement: In/NotIn need values, Exists/DoesNotExist none, Gt/Lt exactly one
// integer; another operator is NotSupported).
std::optional<bool> label_requirement_matches(const json& e, const json& labels) {
  bool all_strings = true;
  auto values = string_values(e, all_strings);
  if (!all_strings) return std::nullopt;
  std::string op = str(e, "operator");
  std::string key = str(e, "key");
  std::optional<std::string> have;
  if (labels.is_object() && labels.contains(key) && labels[key].is_string())
    have = labels[key].get<std::string>();
  auto listed = [&] {
    return have && std::find(values.begin(), values.end(), *have) != values.end();
  };
  if (op == "In" || op == "NotIn") {
    if (values.empty()) return std::nullopt;
    return op == "In" ? listed() : !listed();
  }
  if (op == "Exists" || op == "DoesNotExist") {
    if (!values.empty()) return std::nullopt;
    return op == "Exists" ? have.has_value() : !have.has_value();
  }
  if (op == "Gt" || op == "Lt") {
    if (values.size() != 1) return std::nullopt;
    auto bound = go_parse_int64(values[0]);
    if (!bound) return std::nullopt;
    if (!have) return false;
    auto value = go_parse_int64(*have);  // a label that is not a number matches neither
    if (!value) return false;
    return op == "Gt" ? *value > *bound : *value < *bound;
  }
  return std::nullopt;
}

// One NodeSelectorRequirement of matchFields (nodeSelectorRequirementsAsFieldSelector: In or
// NotIn with exactly one value). The node's only field is metadata.name; fields.Set.Get of any
// other key is "".
std::optional<bool> field_requirement_matches(const json& e, const std::string& node_name) {
  bool all_strings = true;
  auto values = string_values(e, all_strings);
  std::string op = str(e, "operator");
  if (!all_strings || values.size() != 1 || (op != "In" && op != "NotIn")) return std::nullopt;
  std::string have = str(e, "key") == "metadata.name" ? node_name : "";
  return op == "In" ? have == values[0] : have != values[0];
}

bool term_matches(const json& term, const json& node) {
  const json& expressions = field(term, "matchExpressions");
  const json& fields = field(term, "matchFields");
  const bool has_expressions = expressions.is_array() && !expressions.empty();
  const bool has_fields = fields.is_array() && !fields.empty();
  if (!has_expressions && !has_fields) return false;  // nil or empty term selects no objects
  const json& labels = field(field(node, "metadata"), "labels");
  const std::string name = str(field(node, "metadata"), "name");
  bool matched = true;
  // A requirement that does not parse fails the whole term, whatever the others say.
  if (has_expressions) {
    for (const auto& e : expressions) {
      auto m = label_requirement_matches(e, labels);
      if (!m) return false;
      matched = matched && *m;
    }
  }
  if (has_fields) {
    for (const auto& e : fields) {
      auto m = field_requirement_matches(e, name);
      if (!m) return false;
      // nodeSelectorTerm.match checks fields only when the node has any (a name).
      if (!name.empty()) matched = matched && *m;
    }
  }
  return matched;
}

std::string pod_ref(const json& meta) {
  return cat("pod ", str(meta, "namespace"), "/", str(meta, "name"));
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

bool node_affinity_matches(const json& node_selector, const json& node) {
  for (const auto& term : array_or_empty(node_selector, "nodeSelectorTerms"))
    if (term_matches(term, node)) return true;
  return false;
}

Placement placement_of(const json& pod_spec) {
  Placement p;
  p.tolerations = array_or_empty(pod_spec, "tolerations");
  const json& selector = field(pod_spec, "nodeSelector");
  if (selector.is_object()) {
    for (const auto& [k, v] : selector.items())
      if (v.is_string()) p.node_selector[k] = v.get<std::string>();
  }
  const json& required = field(field(field(pod_spec, "affinity"), "nodeAffinity"),
                               "requiredDuringSchedulingIgnoredDuringExecution");
  if (required.is_object()) p.required_affinity = required;
  return p;
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
  auto gpus = effective_request(pod_spec, resource);
  if (!gpus)
    return std::unexpected(gpus.error().wrap(cat("Deployment ", d.ns, "/", d.name, " template")));
  static_cast<Placement&>(d.pod) = placement_of(pod_spec);
  d.pod.gpus = *gpus;
  if (d.pod.gpus <= 0) {
    return fail(Errc::invalid_argument, "Deployment ", d.ns, "/", d.name,
                ": its pod template requests no ", resource,
                " (spec.template.spec.containers[*].resources); nothing for GPU capacity to bound");
  }
  return d;
}

std::optional<Exclusion> why_excluded(const json& node, const Placement& pod) {
  const json& labels = field(field(node, "metadata"), "labels");
  for (const auto& [k, v] : pod.node_selector) {
    if (!labels.is_object() || !labels.contains(k) || labels[k] != v)
      return Exclusion{"nodeSelector", "lacks label " + k + "=" + v + " (nodeSelector)"};
  }
  if (!pod.required_affinity.is_null() && !node_affinity_matches(pod.required_affinity, node))
    return Exclusion{"nodeAffinity", "required node affinity unmet"};
  if (auto taint = untolerated_taint(pod.tolerations, field(field(node, "spec"), "taints"))) {
    return Exclusion{"taint",
                     cat("taint ", str(*taint, "key"), str(*taint, "value").empty() ? "" : "=",
                         str(*taint, "value"), ":", str(*taint, "effect"), " not tolerated")};
  }
  return std::nullopt;
}

std::optional<std::string> why_unschedulable(const json& node, const Placement& pod) {
  const json& spec = field(node, "spec");
  if (field(spec, "unschedulable").is_boolean() && field(spec, "unschedulable").get<bool>())
    return "cordoned (spec.unschedulable)";
  std::string ready = "Unknown";
  for (const auto& c : array_or_empty(field(node, "status"), "conditions")) {
    if (str(c, "type") == "Ready") ready = str(c, "status");
  }
  if (ready != "True") return "not Ready (" + ready + ")";
  if (auto e = why_excluded(node, pod)) return e->why;
  return std::nullopt;
}

namespace {

// A node a new pod of the Deployment can land on.
struct Candidate {
  const json* node;
  std::string name;
  long allocatable;
};

// Why an unbound pod asking for `request` can go to none of the candidates, or nullopt when one
// can take it (its filters pass there and the request fits the node's allocatable).
std::optional<Notice> why_not_demand(const json& pod, long request, const std::string& resource,
                                     const std::vector<Candidate>& candidates) {
  const Placement placement = placement_of(field(pod, "spec"));
  std::set<std::string> kinds;
  std::vector<std::string> reasons;
  for (const auto& c : candidates) {
    std::optional<Exclusion> e = why_excluded(*c.node, placement);
    if (!e && request > c.allocatable)
      e = Exclusion{"request", cat("allocatable ", c.allocatable, " is less")};
    if (!e) return std::nullopt;
    kinds.insert(e->kind);
    reasons.push_back(c.name + ": " + e->why);
  }
  constexpr size_t kNamed = 3;  // an Event note is at most 1 kB
  size_t more = reasons.size() > kNamed ? reasons.size() - kNamed : 0;
  reasons.resize(std::min(reasons.size(), kNamed));
  if (more) reasons.push_back(cat("and ", more, " more node(s)"));
  return Notice{
      pod_ref(field(pod, "metadata")),
      join(std::vector<std::string>(kinds.begin(), kinds.end()), ","),
      cat("requests ", request, " ", resource, " but no node new pods can land on can take it (",
          join(reasons, "; "), "); not counted as demand")};
}

}  // namespace

Capacity free_capacity(const std::vector<json>& nodes, const std::vector<json>& pods,
                       const DeploymentView& deployment, const std::string& resource) {
  Capacity out;
  // 1. The nodes a new pod of the Deployment can land on, with what they can allocate.
  std::vector<Candidate> candidates;
  for (const auto& n : nodes) {
    ++out.nodes;
    std::string name = str(field(n, "metadata"), "name");
    if (auto why = why_unschedulable(n, deployment.pod)) {
      out.skipped.push_back(name + ": " + *why);
      continue;
    }
    auto allocatable = resource_count(field(field(n, "status"), "allocatable"), resource);
    if (!allocatable) {
      out.skipped.push_back(name + ": unreadable allocatable");
      out.unreadable.push_back(
          {"node " + name, "quantity", "status.allocatable." + allocatable.error().message});
      continue;
    }
    ++out.schedulable_nodes;
    candidates.push_back({&n, name, *allocatable});
  }
  // 2. What pods take: a bound pod its node's GPUs; an unbound one is demand only where it
  //    could land (the scheduler would never put it anywhere else).
  std::map<std::string, long> used;  // by node name
  long existing = 0;                 // the Deployment's pods, not being deleted
  for (const auto& p : pods) {
    const json& meta = field(p, "metadata");
    const json& spec = field(p, "spec");
    std::string phase = str(field(p, "status"), "phase");
    if (phase == "Succeeded" || phase == "Failed") continue;
    if (str(meta, "namespace") == deployment.ns && !meta.contains("deletionTimestamp") &&
        selector_matches(deployment.selector, field(meta, "labels")))
      ++existing;
    std::string node = str(spec, "nodeName");
    auto request = effective_request(spec, resource);
    if (!request) {
      out.unreadable.push_back({pod_ref(meta), "quantity", request.error().message});
      // Its node's GPUs cannot be told free: count them taken (the safe side).
      if (!node.empty()) used[node] = LONG_MAX;
      continue;
    }
    if (*request == 0) continue;
    // A terminating pod holds its GPUs until it is gone, but its replacement is already asked.
    if (!node.empty()) {
      used[node] = sat_add(used[node], *request);
      continue;
    }
    if (candidates.empty()) continue;  // nothing is free anyway: no one to name
    if (auto why = why_not_demand(p, *request, resource, candidates)) {
      out.ignored.push_back(std::move(*why));
      continue;
    }
    out.pending_gpus = sat_add(out.pending_gpus, *request);
  }
  // 3. Whole pods per node, less what is on its way.
  out.not_created = std::max(0L, sat_sub(deployment.replicas, existing));
  const long per_pod = std::max(1L, deployment.pod.gpus);
  long whole_pods = 0;
  for (const auto& c : candidates) {
    long free_here = std::max(0L, sat_sub(c.allocatable, used[c.name]));
    whole_pods = sat_add(whole_pods, free_here / per_pod);
  }
  long taken = sat_add(out.pending_gpus, sat_mul(out.not_created, per_pod));
  out.free_gpus = std::max(0L, sat_sub(sat_mul(whole_pods, per_pod), taken));
  return out;
}

json project_pod(const json& pod) {
  const json& meta = field(pod, "metadata");
  const json& spec = field(pod, "spec");
  json m{{"name", str(meta, "name")},
         {"namespace", str(meta, "namespace")},
         {"uid", str(meta, "uid")},
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
      if (!str(c, "name").empty()) kept["name"] = str(c, "name");  // errors name the container
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
  // Where an unbound pod may go (why_not_demand).
  if (field(spec, "nodeSelector").is_object()) s["nodeSelector"] = spec["nodeSelector"];
  if (field(spec, "tolerations").is_array()) s["tolerations"] = spec["tolerations"];
  const json& required = field(field(field(spec, "affinity"), "nodeAffinity"),
                               "requiredDuringSchedulingIgnoredDuringExecution");
  if (!required.is_null())
    s["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = required;
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
