// Gathering a node's Snapshot: NVML, /proc, cgroups, OCI bundles, the kubelet's PodResources
// API, containerd's config and the device plugin directory. Every host path goes through HostFs,
// so `--host-root /host` works from a pod and tests run on fake trees. A layer that cannot be
// read is noted in Snapshot::skipped and the rest is still gathered.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/hostfs.hpp"
#include "distribution/distribution.hpp"
#include "doctor/snapshot.hpp"

namespace gpufence {

// Where to look, by default wherever any distribution keeps the thing (the first found counts),
// in the table's detection order (distribution/distribution.hpp).
struct GatherOptions {
  std::vector<std::string> pod_resources_sockets =
      every_distribution(NodePath::pod_resources_socket);
  bool probe = false;
  std::vector<std::string> app_configs;  // paths inside containers
  std::vector<std::string> handlers = {"nvidia"};
  std::vector<std::string> containerd_configs = every_distribution(NodePath::containerd_config);
  // Where OCI state lives: containerd's task dirs (bundle = <dir>/<ns>/<id>), runc roots
  // (<root>[/<ns>]/<id>/state.json, bundle in its "bundle=" label).
  std::vector<std::string> task_dirs = every_distribution(NodePath::task_dir);
  std::vector<std::string> runc_roots = {"/run/containerd/runc", "/run/runc"};
  std::vector<std::string> plugin_dirs = every_distribution(NodePath::device_plugin_dir);
  std::string resource_name = std::string(kGpuResourceName);
  // `gpufence install`'s record: which enforcement (handler, NRI, both) the node was given.
  std::string install_state = "/etc/gpufence/install-state.json";
  std::string nri_plugin_name = "gpufence-nri";
};

class KubeClient;

// `inventory` may be null (NVML unavailable: `inventory_error` says why); so may `kube` (no API
// access: `kube_error` says why). `node_name` picks this node's objects in the API.
Snapshot gather_snapshot(const HostFs& host, GpuInventory* inventory,
                         const std::string& inventory_error, const GatherOptions& options,
                         KubeClient* kube = nullptr, const std::string& kube_error = "",
                         const std::string& node_name = "");

// The API server's view of one node: its capacity, its pods, the RuntimeClasses.
Result<KubeView> read_kube_view(KubeClient& kube, const std::string& node_name,
                                const std::string& resource_name);

// The helper behind --probe: a child process joins the container's devices cgroup and opens
// each GPU node (the container's own, or a temporary node for one it does not have); EPERM means
// denied, ENXIO or success allowed, any other error fails the probe. The child exits and every
// temporary node is removed; a child not done within `timeout` is killed and the probe fails.
inline constexpr std::chrono::milliseconds kProbeTimeout{10000};
// What one open in the container's cgroup says: `err` is 0 for success, else its errno.
enum class ProbeOpen { allowed, denied, inconclusive };
ProbeOpen probe_open_verdict(int err);
Result<std::set<unsigned>> probe_gpu_access(const HostFs& host, unsigned pid,
                                            const std::string& cgroup_procs_file,
                                            const std::set<unsigned>& minors,
                                            std::chrono::milliseconds timeout = kProbeTimeout);

// PodResources v1 over the kubelet's socket: List and GetAllocatableResources.
struct PodResourcesView {
  std::vector<KubeletAllocation> allocations;
  std::vector<std::string> allocatable;
};
Result<PodResourcesView> read_pod_resources(const std::string& socket_path,
                                            const std::string& resource_name);

}  // namespace gpufence
