// One reconcile of `gpufence autoscale` as named steps: read demand, read the Deployment (its
// template says what a pod requests and where it may run), work out the free GPU capacity new
// pods can really use, recommend, stabilise, write the scale with its resourceVersion (re-read and
// retry on 409), and record an Event. A Controller adds leader election around it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "autoscale/capacity.hpp"
#include "autoscale/events.hpp"
#include "autoscale/leader.hpp"
#include "autoscale/policy.hpp"
#include "common/error.hpp"
#include "gpu/wire_contract.hpp"
#include "kube/client.hpp"
#include "kube/watch.hpp"

namespace gpufence {

struct AutoscaleOptions {
  std::string ns, deployment;
  long streams_per_pod = 4, min_replicas = 0, max_replicas = 10;
  std::string node_selector;  // label selector of GPU nodes ("" = every node)
  std::string resource = std::string(kGpuResourceName);
  bool dry_run = false;
};

struct ReconcileResult {
  long streams = 0, current = 0, free_gpus = 0, desired = 0, gpus_per_pod = 0;
  bool scaled = false;
  bool capped = false;  // demand wanted more pods than the free GPUs hold
  std::string reason;
  Capacity capacity;
  DeploymentView deployment;  // as read this time
  std::string event_error;    // the Event could not be recorded (the scale itself stands)
};

using StreamSource = std::function<Result<long>()>;

// The nodes (of the node selector) and the pods that are not Succeeded or Failed.
struct ClusterView {
  std::vector<nlohmann::json> nodes, pods;
};
using ClusterSource = std::function<Result<ClusterView>()>;

// Pods are asked for with this field selector, so finished ones never travel.
inline constexpr const char* kLivePods = "status.phase!=Succeeded,status.phase!=Failed";

// One paginated list of each, every call (for --once).
ClusterSource cluster_from_lists(KubeClient& kube, const std::string& node_selector);

// Nodes and pods kept by list + watch on two threads: a reconcile reads the local copies and
// sends no request for them.
class ClusterWatch {
 public:
  ClusterWatch(KubeClient& kube, const std::string& node_selector);
  // Lists both now (so the first reconcile has data), then keeps them current.
  Status start();
  void stop();
  ClusterSource source();
  WatchCache& nodes() { return m_nodes; }
  WatchCache& pods() { return m_pods; }

 private:
  WatchCache m_nodes, m_pods;
};

Result<ReconcileResult> reconcile(KubeClient& kube, const AutoscaleOptions& opt,
                                  const StreamSource& streams, const ClusterSource& cluster,
                                  Stabilizer& stabilizer, SteadyTime now,
                                  const EventSource* events = nullptr);

// Reconciles only while this replica holds the Lease (or always, without one).
class Controller {
 public:
  Controller(KubeClient& kube, AutoscaleOptions opt, StreamSource streams, ClusterSource cluster,
             EventSource events, std::optional<LeaseOptions> lease);
  struct Step {
    bool leader = true;
    std::string holder;  // the Lease's holder when not leader
    std::optional<ReconcileResult> result;
    std::optional<Error> error;
  };
  Step step(SteadyTime now);
  // Gives up the Lease when holding it (on SIGTERM), so a peer takes over at once.
  Status shutdown();

 private:
  KubeClient& m_kube;
  AutoscaleOptions m_opt;
  StreamSource m_streams;
  ClusterSource m_cluster;
  EventSource m_events;
  std::optional<LeaderElector> m_elector;
  Stabilizer m_stabilizer;
  bool m_capped =
      false;  // the last reconcile was capped: warn once when it starts, not each period
  // "object|kind" of every notice already recorded as an Event and still true: one Event per
  // object and reason, not one per period; forgotten when the notice goes away.
  std::set<std::string> m_noticed;
  void report_notices(ReconcileResult& r);
};

// Streams from a ConfigMap key ("ns/name:key") or a file holding a number.
StreamSource streams_from_configmap(KubeClient& kube, const std::string& spec);
StreamSource streams_from_file(const std::string& path);

}  // namespace gpufence
