// /etc/gpufence/runtime.toml (override: $GPUFENCE_RUNTIME_CONFIG). Every key, with its default,
// is documented in deploy/runtime.toml. An unknown key is an error: a typo in an isolation policy
// must not silently fall back to a default.
#pragma once

#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/paths.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

inline constexpr const char* kRuntimeConfigPath = paths::kRuntimeConfig.data();
inline constexpr const char* kRuntimeConfigEnv = "GPUFENCE_RUNTIME_CONFIG";

// Where an allocation comes from (docs/trust-model.md): one enum for the channel a decision used
// and for the ones runtime.toml switches. The kubelet's device specs always count; the three
// switchable ones are listed in [allocation] trusted_channels by channel_name.
enum class Channel { none, cdi_annotations, device_specs, mount_markers, envvar };
std::string_view channel_name(Channel channel);
inline constexpr Channel kSwitchableChannels[] = {Channel::cdi_annotations, Channel::mount_markers,
                                                  Channel::envvar};
// What to do with a spec that admits every device (admits_all_devices) and asks for no GPU. Its
// key in runtime.toml is [allocation] privileged, kept as the file's interface.
enum class AllDevicesPolicy { isolate, passthrough };

// Every path of the wire contract's control-node list (gpu/wire_contract.hpp).
inline std::vector<std::string> default_control_nodes() {
  std::vector<std::string> out;
  for (const auto& n : kControlNodes) out.emplace_back(n.path);
  return out;
}

// Where gpufence-nri keeps its status and the doctor reads it (runtime.toml [nri] status_file).
inline constexpr std::string_view kNriStatusFile = paths::kNriStatus;

struct RuntimeConfig {
  std::string low_level_runtime = "runc";  // a path, or a name looked up on PATH
  // "" logs to stderr. gpufence's own directory, which no common hostPath covers (runtime.toml).
  std::string log_file = std::string(paths::kRuntimeLog);
  std::string log_level = "info";
  std::vector<Channel> trusted_channels = {Channel::cdi_annotations, Channel::mount_markers};
  AllDevicesPolicy all_devices_policy = AllDevicesPolicy::isolate;
  std::vector<std::string> annotation_prefixes = {std::string(kCdiAnnotationPrefix)};
  std::string device_root = "/";  // host root under which /dev/nvidia* are found
  std::vector<std::string> control_nodes = default_control_nodes();
  std::string nvml_library;  // "" = $GPUFENCE_NVML_LIBRARY or libnvidia-ml.so.1
  std::vector<std::string> cdi_spec_dirs = {"/etc/cdi", "/var/run/cdi"};
  // CDI kinds besides kGpuCdiKinds whose devices are GPUs ([cdi] gpu_kinds): another DRA
  // driver's, e.g. NVIDIA's "k8s.gpu.nvidia.com/claim". Their names are per claim, not GPU ids,
  // so a name counts as the GPUs its spec's device nodes are, by device number.
  std::vector<std::string> gpu_cdi_kinds;
  // The driver's per-GPU directory; inside a container it is narrowed to the granted GPUs.
  std::string procfs_gpus_dir = "/proc/driver/nvidia/gpus";
  // gpufence-nri's status for the doctor (nri/status.hpp); "" writes none. Beside the log, in
  // gpufence's own directory.
  std::string nri_status_file = std::string(kNriStatusFile);
  // Where gpufence-nri's keepers hold their locks ([nri] keeper_dir; "" starts no keeper) and the
  // NRI socket a keeper reconnects through ([nri] socket): nri/keeper.hpp.
  std::string nri_keeper_dir;  // "" by default; runtime.toml as install writes it sets one
  std::string nri_socket = "/var/run/nri/nri.sock";
  // Kubernetes namespaces whose containers gpufence-nri leaves as containerd made them ([nri]
  // node_agent_namespaces): the one gpufence is installed in, so its device plugin, which opens
  // every GPU through NVML and requests none, keeps them when it is recreated under NRI. A pod's
  // namespace is the kubelet's (CRI sandbox metadata), never the pod's own bytes; whoever may
  // create pods there gets every GPU (docs/trust-model.md).
  std::vector<std::string> nri_node_agent_namespaces;

  bool trusts(Channel c) const;
  // Whether `kind` is one of gpu_cdi_kinds (never one of kGpuCdiKinds, which name GPU ids).
  bool is_listed_gpu_kind(std::string_view kind) const;
};

// Why `kind` cannot be a [cdi] gpu_kinds entry (not vendor/class, or one of kGpuCdiKinds), or ok.
Status check_gpu_cdi_kind(std::string_view kind);

// Parses TOML text; `origin` names the file in errors.
Result<RuntimeConfig> parse_runtime_config(std::string_view text, std::string_view origin);
// The file named by $GPUFENCE_RUNTIME_CONFIG, else /etc/gpufence/runtime.toml. A missing
// default file means defaults; a missing file named explicitly, or any unreadable or broken
// file, is an error.
Result<RuntimeConfig> load_runtime_config();

}  // namespace gpufence
