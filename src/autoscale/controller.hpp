// One reconcile of `gpufence autoscale`: read demand and free GPU capacity, recommend, stabilise,
// and write the Deployment's scale with its resourceVersion (re-read and retry on 409).
#pragma once

#include <functional>
#include <string>

#include "autoscale/policy.hpp"
#include "common/error.hpp"
#include "kube/client.hpp"

namespace gpufence {

struct AutoscaleOptions {
  std::string ns, deployment;
  long streams_per_pod = 4, gpus_per_pod = 1, min_replicas = 0, max_replicas = 10;
  std::string node_selector;  // label selector of GPU nodes ("" = every node)
  std::string resource = "nvidia.com/gpu";
  bool dry_run = false;
};

struct ReconcileResult {
  long streams = 0, current = 0, free_gpus = 0, desired = 0;
  bool scaled = false;
  std::string reason;
};

using StreamSource = std::function<Result<long>()>;

// Free capacity: allocatable GPUs of the selected nodes minus the GPU limits of every pod that is
// not finished and is on one of them or not yet scheduled (a Pending pod will take its GPU).
Result<long> free_gpus(KubeClient& kube, const std::string& node_selector,
                       const std::string& resource);

Result<ReconcileResult> reconcile(KubeClient& kube, const AutoscaleOptions& opt,
                                  const StreamSource& streams, Stabilizer& stabilizer,
                                  SteadyTime now);

// Streams from a ConfigMap key ("ns/name:key") or a file holding a number.
StreamSource streams_from_configmap(KubeClient& kube, const std::string& spec);
StreamSource streams_from_file(const std::string& path);

}  // namespace gpufence
