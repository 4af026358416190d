// What the doctor knows about a node: evidence from every layer, gathered once (gather.cpp)
// and judged by pure checks (checks.cpp). Where a layer could not be read, `skipped` says why.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cdi/spec_dirs.hpp"
#include "common/finding.hpp"
#include "common/paths.hpp"
#include "gpu/gpu.hpp"
#include "gpu/wire_contract.hpp"
#include "nri/status.hpp"
#include "podresources/podresources.hpp"

namespace gpufence {

struct NodeGpu {
  Gpu gpu;
  std::vector<GpuProcess> processes;
};

struct NodeContainer {
  std::string id;
  std::string pod, pod_namespace, name;  // from the OCI bundle's CRI annotations; empty if unknown
  std::string bundle;
  std::vector<unsigned> pids;
  std::optional<std::string> nvidia_visible_devices, cuda_visible_devices;
  // CAP_SYS_ADMIN in its CapBnd (what a privileged pod gets, but also a pod that adds the
  // capability): it can remount the cgroupfs and reach any device. Rendered as "privileged" in
  // the report's text and JSON, whose names are an interface.
  bool has_cap_sys_admin = false;
  std::set<unsigned> gpu_nodes_present;        // minors of /dev/nvidiaN in its /dev
  std::optional<std::set<unsigned>> openable;  // minors its cgroup lets it open; nullopt = unknown
  std::string openable_source;                 // "probe", "devices.list", "oci-spec rules"
  // Its processes outside its own devices cgroup, observed: "pid N in devices cgroup /" (a v1
  // devices line without its id, or a process of its PID namespace in no container's cgroup).
  // The rules of its cgroup say nothing about what those can open.
  std::vector<std::string> left_cgroup;
  // Observed through /proc/<pid> of one member (nullopt: not readable):
  std::optional<bool> host_pid;  // its ns/pid is PID 1's: it shares the host's PID namespace
  std::optional<unsigned long long> cap_eff, cap_bnd;   // CapEff, CapBnd of /proc/<pid>/status
  std::vector<std::string> writable_sysfs;              // writable_sysfs_mounts() of its mountinfo
  std::map<std::string, std::vector<int>> app_gpu_ids;  // DeepStream config path -> gpu-id values
  std::string label() const;                            // "namespace/pod/container" or the short id
  // Whether `openable` was observed (the probe opened each node in its cgroup) rather than read
  // from rules (devices.list, the OCI spec), which say what the cgroup should allow.
  bool openable_observed() const { return openable && openable_source == "probe"; }
};

// One container's entry of the kubelet's device checkpoint (kubelet_internal_checkpoint): the ids
// it was allocated and the GPU device specs of the Allocate answer the kubelet replays for it.
struct CheckpointAllocation {
  std::string pod_uid, container;
  std::vector<std::string> device_ids;
  std::vector<unsigned> device_minors;  // N of each /dev/nvidiaN device spec (host path)
};

// A pod on this node as the API server describes it.
struct KubePod {
  std::string pod_namespace, name;
  std::string runtime_class;  // spec.runtimeClassName, "" when unset
  long gpus = 0;              // sum of the resource's limits over its containers
  bool privileged = false;    // any container with securityContext.privileged: true
  std::vector<std::string>
      env_visible_devices;  // "container: value" of NVIDIA_VISIBLE_DEVICES set in the spec
  std::map<std::string, std::string> annotations = {};  // metadata.annotations (the pod's bytes)
  std::string uid = "";    // metadata.uid (the kubelet's checkpoint names pods by it)
  std::string phase = "";  // status.phase
  // status.startTime (when the kubelet took the pod on), else metadata.creationTimestamp.
  std::optional<std::chrono::system_clock::time_point> started = std::nullopt;
  // "container: reason" of each container status waiting (ContainerCreating, ...).
  std::vector<std::string> waiting = {};
  // The ownerReference with controller: true, when it is an apps DaemonSet: its name. Whoever
  // creates a pod writes its ownerReferences, so this says something only together with the
  // namespace, which the API's authorization decides (checks.cpp, own_pod).
  std::string daemonset = "";
};

struct KubeView {
  std::optional<long> capacity, allocatable;  // the node's, for the resource
  // Devices this node's ResourceSlices publish, by DRA driver (empty where resource.k8s.io/v1
  // is not served or not readable).
  std::map<std::string, long> dra_devices;
  std::map<std::string, std::string> runtime_classes;  // name -> handler
  std::vector<KubePod> pods;
};

// containerd's NRI as the node has it, and the enforcement `gpufence install` recorded
// (docs/nri.md).
struct NriView {
  std::string enforcement;  // the install record's "runtime", "nri", "both"; "" = no record
  std::string state_file;   // the record read
  bool enabled = false;     // in the config containerd reads (imports merged; its default)
  std::string socket_path;  // socket_path, default /var/run/nri/nri.sock
  bool socket_present = false;
  bool validator_enabled = false;
  std::vector<std::string> required_plugins;
  // default_validator.tolerate_missing_plugins_annotation: a key NRI reads from the POD's
  // annotations (KEY, KEY/pod, KEY/container.NAME); "true" there waives required_plugins.
  std::string tolerate_annotation;
  std::string plugin_name = std::string(paths::kNriPluginName);
  // The fence (containerd >= 2.2): gpufence-nri linked again into plugin_path under this name,
  // rejecting what the decider did not decide. Its link: install's record, else
  // <plugin_path>/20-gpufence-fence; present = the link is there and leads to a file.
  std::string fence_name = "gpufence-fence";
  std::string fence_link;
  bool fence_link_present = false;
  // gpufence-nri's own account (nri/status.hpp): connected or not, what it found at Synchronize.
  std::string status_file;
  std::optional<nri::NriStatus> status;  // nullopt: status_error says why
  std::string status_error;
  enum class Process { running, gone, unknown };
  Process plugin_process = Process::unknown;  // the status's pid, same start time: still it
  // Seconds since the status says it connected, when it is connected; -1: unknown.
  int64_t connected_for_s = -1;
  bool uses_nri() const { return enforcement == "nri" || enforcement == "both"; }
  // gpufence-nri enforces right now, install record or not (a DaemonSet or service the record
  // does not know): its status says connected and its pid is still that process.
  bool live() const {
    return status && status->state == nri::NriState::connected &&
           plugin_process == Process::running;
  }
  // Where NRI is gpufence's enforcement point: the record says so, or the plugin is seen live.
  bool enforcing() const { return uses_nri() || live(); }
  bool required(const std::string& name) const {
    return validator_enabled && std::find(required_plugins.begin(), required_plugins.end(), name) !=
                                    required_plugins.end();
  }
  bool fail_closed() const { return required(plugin_name); }
};

struct Snapshot {
  std::vector<NodeGpu> gpus;
  std::vector<NodeContainer> containers;
  std::optional<std::vector<KubeletAllocation>> allocations;  // nullopt: PodResources unreadable
  std::optional<std::vector<std::string>> allocatable;  // nvidia.com/gpu ids the kubelet can give
  std::string resource_name = std::string(kGpuResourceName);
  std::optional<KubeView> kube;  // nullopt: no API access (skipped says why)
  std::vector<Finding> containerd_findings;
  std::string
      containerd_default_binary;  // BinaryName of containerd's default runtime, "" = plain runc
  std::string containerd_config;  // path read, "" if none
  std::map<std::string, std::string>
      containerd_binaries;  // CRI runtime handler -> its BinaryName ("" = plain runc)
  std::string containerd_default_runtime;   // the default handler's name
  bool probed = false;                      // --probe asked for
  std::optional<std::string> ptrace_scope;  // /proc/sys/kernel/yama/ptrace_scope, if Yama is on
  std::vector<CdiFileSummary>
      cdi_specs;  // in containerd's cdi_spec_dirs (default /etc/cdi, /var/run/cdi)
  std::vector<std::string> plugin_sockets;       // device plugin sockets present
  std::vector<CheckpointAllocation> checkpoint;  // the kubelet's stored answers, if readable
  std::string checkpoint_path;                   // the file read, "" if none
  std::optional<NriView> nri;                    // nullopt: no containerd config read
  std::vector<std::string> skipped;              // "NVML: cannot load ...", "kubelet: ..."
  // gpufence's own pods: in this namespace (the install's, which tenants cannot create pods in;
  // "" = none known) and controlled by one of these DaemonSets (the chart's).
  std::string system_namespace;
  std::vector<std::string> system_daemonsets;
  std::chrono::system_clock::time_point taken_at{};  // when gathered: pods' ages count from it
  // A pod holding GPUs with no container running this long is named
  // (pod.gpu-held-without-container).
  std::chrono::seconds held_after{300};
  // DRA drivers whose devices are GPUs: their slices serve the node's GPUs instead of (never
  // beside) a device plugin.
  std::vector<std::string> gpu_dra_drivers;
};

}  // namespace gpufence
