// Gathering a node's Snapshot: NVML, /proc, cgroups, OCI bundles, the kubelet's PodResources
// API, containerd's config and the device plugin directory. Every host path goes through HostFs,
// so `--host-root /host` works from a pod and tests run on fake trees. A layer that cannot be
// read is noted in Snapshot::skipped and the rest is still gathered.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/hostfs.hpp"
#include "common/paths.hpp"
#include "containerd/config.hpp"
#include "distribution/distribution.hpp"
#include "doctor/snapshot.hpp"
#include "runtime/config.hpp"

namespace gpufence {

// Where to look, by default wherever any distribution keeps the thing (the first found counts),
// in the table's detection order (distribution/distribution.hpp).
struct GatherOptions {
  std::vector<std::string> pod_resources_sockets =
      every_distribution(NodePath::pod_resources_socket);
  bool probe = false;
  std::vector<std::string> app_configs;  // paths inside containers
  std::vector<std::string> handlers = {std::string(kDefaultHandlerName)};
  std::vector<std::string> containerd_configs = every_distribution(NodePath::containerd_config);
  // Where OCI state lives: containerd's task dirs (bundle = <dir>/<ns>/<id>), runc roots
  // (<root>[/<ns>]/<id>/state.json, bundle in its "bundle=" label).
  std::vector<std::string> task_dirs = every_distribution(NodePath::task_dir);
  std::vector<std::string> runc_roots = {"/run/containerd/runc", "/run/runc"};
  std::vector<std::string> plugin_dirs = every_distribution(NodePath::device_plugin_dir);
  std::string resource_name = std::string(kGpuResourceName);
  // `gpufence install`'s record: which enforcement (handler, NRI, both) the node was given.
  std::string install_state = std::string(paths::kInstallState);
  std::string nri_plugin_name = std::string(paths::kNriPluginName);
  // The fence's name and index in containerd's NRI plugin_path (install's defaults).
  std::string nri_fence_name = "gpufence-fence";
  std::string nri_fence_index = "20";
  // gpufence-nri's status file (runtime.toml [nri] status_file).
  std::string nri_status = std::string(kNriStatusFile);
  // runtime.toml, a host path: its [cdi] gpu_kinds name another DRA driver's kinds, whose claims
  // count as the GPUs their CDI specs give (as gpufence-nri reads them).
  std::string runtime_config = kRuntimeConfigPath;
  // gpufence's own pods (Snapshot::system_namespace): the namespace it was installed in ("" =
  // none known: no pod is taken for gpufence's) and the chart's DaemonSets.
  std::string system_namespace;
  std::vector<std::string> system_daemonsets = {"gpufence-device-plugin", "gpufence-dra",
                                                "gpufence-node-installer", "gpufence-doctor-agent"};
  std::chrono::seconds held_after{300};  // Snapshot::held_after
  // DRA drivers whose devices are GPUs (Snapshot::gpu_dra_drivers): gpufence-dra's and
  // NVIDIA's.
  std::vector<std::string> gpu_dra_drivers = {"gpufence.io", "gpu.nvidia.com"};
};

class KubeClient;

// A source the doctor may lack: the source, or why it is absent (gathering notes that in
// Snapshot::skipped and goes on without it).
template <class T>
using DoctorSource = Result<std::reference_wrapper<T>>;

// The outside world the doctor reads besides the host's files.
struct GatherSources {
  DoctorSource<GpuInventory> inventory = fail(Errc::nvml, "no GPU inventory given");
  DoctorSource<KubeClient> kube =
      fail(Errc::invalid_argument, "not asked (--kubeconfig or --in-cluster)");
  std::string node_name = "";  // picks this node's objects in the API
  PodResourcesReader read_pod_resources = [](const std::string& socket,
                                             const std::string& resource) {
    return gpufence::read_pod_resources(socket, resource);
  };
};

// The snapshot, in named steps (gather.cpp, gather_snapshot): the API server's view, NVML's
// GPUs, the containers from /proc and their cgroups, the kubelet's PodResources and device
// plugin directory, containerd's config.
Snapshot gather_snapshot(const HostFs& host, const GatherOptions& options,
                         const GatherSources& sources);

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

}  // namespace gpufence
