// Settings of gpufence-device-plugin, filled from its command line.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "distribution/distribution.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

enum class DeviceIdStrategy { uuid, index };

// How the Allocate answer carries the allocation (NVIDIA's device-list-strategy names).
enum class ListStrategy { device_specs, volume_mounts, cdi_annotations, cdi_cri, envvar };

// Application-level XIDs NVIDIA's plugin ignores (internal/rm/health.go): 13 graphics engine
// exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
// 68 video processor exception, 109 context switch timeout.
inline const std::set<std::uint64_t> kDefaultIgnoredXids = {13, 31, 43, 45, 68, 109};

// XIDs after which a GPU stays Unhealthy whatever --health-recovery says, until the plugin
// restarts: 79, the GPU has fallen off the bus (it needs a reset or a reboot).
inline const std::set<std::uint64_t> kDefaultPermanentXids = {79};
// XID 154, GPU_RECOVERY_ACTION_CHANGED: the driver's recovery action changed; the action itself,
// not the XID, decides (docs/monitoring.md, "Health").
inline constexpr std::uint64_t kRecoveryActionChangedXid = 154;

struct HealthOptions {
  bool enabled = true;
  std::set<std::uint64_t> ignored_xids = kDefaultIgnoredXids;
  std::set<std::uint64_t> permanent_xids = kDefaultPermanentXids;
  // A GPU marked Unhealthy by an XID becomes Healthy again after this long with no new critical
  // XID; nullopt = never (NVIDIA's behaviour). A lost GPU recovers when it answers NVML again.
  std::optional<std::chrono::milliseconds> recovery;
};

struct PluginOptions {
  // The kubelet's default root; the chart passes the distribution's
  // (distribution/distribution.hpp).
  std::string plugin_dir = device_plugin_dir();
  std::string resource_name = std::string(kGpuResourceName);
  std::string socket_name = "gpufence-nvidia-gpu.sock";
  DeviceIdStrategy id_strategy = DeviceIdStrategy::uuid;
  std::set<ListStrategy> list_strategies = {ListStrategy::device_specs, ListStrategy::volume_mounts,
                                            ListStrategy::cdi_annotations};
  bool set_cuda_visible_devices = true;
  // Where /dev/nvidia* are looked up; the answers name host paths all the same.
  std::string host_root = "/";
  // Where the device nodes are on the host *as the container runtime sees it*: DeviceSpec
  // host_path is dev_root + "/dev/nvidiaN" (NVIDIA's plugin calls it NvidiaDevRoot; a driver
  // container puts its nodes under e.g. /run/nvidia/driver). "/" on a normal node.
  std::string dev_root = "/";
  std::string cdi_annotation_prefix = std::string(kCdiAnnotationPrefix);
  // Where the plugin writes its own CDI spec for the GPUs (cdi_spec.hpp), as this process sees
  // the directory; "" = never (the flag also takes "off"). /var/run/cdi is the dynamic directory
  // every CDI reader scans.
  std::string cdi_spec_dir = "/var/run/cdi";
  // The host path of gpufence-runtime, run by the spec's update-ldcache hook.
  std::string cdi_hook_path = std::string(kRuntimeBinaryPath);
  // The driver's root on the host, for the spec's driver files (cdi_spec.hpp).
  std::string driver_root = "/";
  HealthOptions health;
  // Re-register when no ListAndWatch stream has been open this long; nullopt: never.
  std::optional<std::chrono::milliseconds> reregister_after = std::chrono::seconds(30);
  // How long one NVML call may take before it counts as hung (start-up calls get 6x).
  std::chrono::milliseconds nvml_timeout = std::chrono::seconds(10);
};

Result<std::set<ListStrategy>> parse_list_strategies(std::string_view text);
Result<DeviceIdStrategy> parse_id_strategy(std::string_view text);
// "48,79" -> {48, 79}; "" -> {}.
Result<std::set<std::uint64_t>> parse_xid_list(std::string_view text);
// "30s", "5m", "1500ms", "0"/"off" -> nullopt.
Result<std::optional<std::chrono::milliseconds>> parse_duration(std::string_view text);

}  // namespace gpufence
