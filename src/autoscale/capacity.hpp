// Where a new pod of the Deployment could run, and how many GPUs it would find there: the
// scheduler's rules the autoscaler must follow so it never asks for pods that can only sit
// Pending. Pure functions over API objects as JSON (docs/autoscale.md cites each rule's source).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "kube/pod_request.hpp"

namespace gpufence {

// Kubernetes' Toleration.ToleratesTaint (k8s.io/api core/v1 toleration.go): an empty effect
// matches every effect; an empty key (with Exists) every key; Exists matches any value, Equal (the
// default) the same value; an operator the API may add later matches nothing (fail closed).
bool tolerates(const nlohmann::json& toleration, const nlohmann::json& taint);
// A taint a new pod must tolerate to be scheduled (NoSchedule, NoExecute) that none of
// `tolerations` tolerates; nullopt when the pod can go there. PreferNoSchedule only steers.
std::optional<nlohmann::json> untolerated_taint(const nlohmann::json& tolerations,
                                                const nlohmann::json& taints);

// matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) of a LabelSelector
// (apimachinery labels.SelectorFromValidatedSet / LabelSelectorAsSelector). An empty selector
// matches everything; an unknown operator matches nothing.
bool selector_matches(const nlohmann::json& selector, const nlohmann::json& labels);

// A pod's spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution (a
// NodeSelector) against a node, as component-helpers nodeaffinity.NodeSelector.Match: terms are
// ORed; an empty term, or one that does not parse, matches nothing; within a term every
// matchExpressions entry (In, NotIn, Exists, DoesNotExist, Gt, Lt on labels) and every
// matchFields entry (In, NotIn with one value, on metadata.name) must hold.
bool node_affinity_matches(const nlohmann::json& node_selector, const nlohmann::json& node);

// Where a pod may go, as the scheduler's filters read it from its spec.
struct Placement {
  std::map<std::string, std::string> node_selector;  // spec.nodeSelector
  nlohmann::json tolerations = nlohmann::json::array();
  nlohmann::json required_affinity;  // the NodeSelector above; null when the pod has none
};
Placement placement_of(const nlohmann::json& pod_spec);

// What a new pod of the Deployment is.
struct PodTemplate : Placement {
  long gpus = 0;  // effective request of the resource
};

struct DeploymentView {
  std::string ns, name, uid;
  long replicas = 0;  // spec.replicas: what the Deployment asked for
  nlohmann::json selector;
  PodTemplate pod;
};
// From an apps/v1 Deployment; an error when its template requests none of `resource` (there is
// then nothing for GPU capacity to bound, and the flag this replaces was surely set wrong), or
// when a request does not parse.
Result<DeploymentView> deployment_view(const nlohmann::json& deployment,
                                       const std::string& resource);

// Why a pod cannot go to a node, as the scheduler's filter plugin that refuses it: `kind` is
// "nodeSelector", "nodeAffinity" or "taint" (NodeAffinity, TaintToleration).
struct Exclusion {
  std::string kind, why;
};
std::optional<Exclusion> why_excluded(const nlohmann::json& node, const Placement& pod);

// Why a new pod cannot land on `node`, or nullopt: cordoned (spec.unschedulable), not Ready
// (its Ready condition is not "True"), or why_excluded.
std::optional<std::string> why_unschedulable(const nlohmann::json& node, const Placement& pod);

// Something a reconcile left out and says so in an Event: a Pending pod not counted as demand,
// or a quantity it could not read. `kind` tells reasons apart (one Event per object and kind).
struct Notice {
  std::string object;  // "pod NS/NAME", "node NAME"
  std::string kind;    // "nodeSelector,taint", "request", "quantity", ...
  std::string why;
};

struct Capacity {
  long free_gpus = 0;                // GPUs new pods can take, whole pods per node only
  long nodes = 0;                    // nodes listed
  long schedulable_nodes = 0;        // of them, those a new pod can land on
  long pending_gpus = 0;             // requested by unbound pods that could land there
  long not_created = 0;              // pods the Deployment asked for that do not exist yet
  std::vector<std::string> skipped;  // "gpu-2: cordoned", ...
  std::vector<Notice> ignored;       // Pending pods no such node can take: not demand
  std::vector<Notice> unreadable;    // quantities that do not parse (that node or pod's GPUs
                                     // count as taken, never as free)
};

// Free capacity for new pods of `deployment`: on each node a new pod can land on, allocatable
// minus what the pods bound there request, rounded down to whole pods; minus what the
// Deployment's not-yet-created replicas will take and what unbound pods request that could land
// on one of those nodes (nodeSelector, required node affinity, taints, a request no larger than
// the node's allocatable). `pods` are the cluster's pods that are not Succeeded or Failed.
// Every sum saturates.
Capacity free_capacity(const std::vector<nlohmann::json>& nodes,
                       const std::vector<nlohmann::json>& pods, const DeploymentView& deployment,
                       const std::string& resource);

// What the watch keeps of a pod: the fields free_capacity reads and nothing else.
nlohmann::json project_pod(const nlohmann::json& pod);
nlohmann::json project_node(const nlohmann::json& node);

}  // namespace gpufence
