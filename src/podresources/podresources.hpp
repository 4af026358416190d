// The kubelet's PodResources v1 API (List, GetAllocatableResources) over its socket: which
// container holds which GPU, as the kubelet recorded it. Read by the doctor (what each container
// was allocated) and the device plugin (the pod labels of its per-GPU metrics). Facts:
// docs/deviceplugin.md, "PodResources".
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

// One container of a pod the kubelet runs, and the GPU ids it was given (device plugin ids, UUIDs
// or indices, and the GPUs of its DRA claims). The kubelet's List names every container of every
// pod it runs, those without devices too.
struct KubeletAllocation {
  std::string pod_namespace, pod, container;
  std::vector<std::string> device_ids;  // nvidia.com/gpu ids (UUIDs or indices)
  // Its DRA claims' CDI names of other kinds, each once: another driver's, which name no GPU id
  // (the doctor resolves those of a kind runtime.toml lists, [cdi] gpu_kinds).
  std::vector<std::string> other_cdi_names = {};
};

// The GPU ids in a container's DRA claims as PodResources lists them (DynamicResource
// claim_resources cdi_devices): the names of GPU CDI kinds (kGpuCdiKinds: gpufence-dra's
// "gpufence.io/gpu=<uuid>"), each once. The kubelet lists a claim's CDI devices cumulatively per
// driver and does not filter them by request (docs/dra.md), so a claim shared by two containers
// counts for both.
std::vector<std::string> gpu_ids_of_cdi_names(const std::vector<std::string>& names);
// The other well-formed CDI names ("<kind>=<name>" of no GPU kind), each once, as listed.
std::vector<std::string> other_cdi_names(const std::vector<std::string>& names);

struct PodResourcesView {
  std::vector<KubeletAllocation> allocations;
  std::vector<std::string> allocatable;
};
// List and GetAllocatableResources for `resource_name`, each call within `deadline`.
Result<PodResourcesView> read_pod_resources(
    const std::string& socket_path, const std::string& resource_name,
    std::chrono::milliseconds deadline = std::chrono::seconds(3));
// List alone (the device plugin's metrics need no allocatable devices): one call within `deadline`.
Result<std::vector<KubeletAllocation>> list_pod_resources(const std::string& socket_path,
                                                          const std::string& resource_name,
                                                          std::chrono::milliseconds deadline);
// What the kubelet's PodResources socket at `socket_path` answers: read_pod_resources (gRPC) on
// a node, a fake in unit tests.
using PodResourcesReader = std::function<Result<PodResourcesView>(
    const std::string& socket_path, const std::string& resource_name)>;

}  // namespace gpufence
