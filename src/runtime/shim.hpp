// gpufence-runtime's flow: on create/run/restore, rewrite the bundle's config.json so the
// container gets exactly its allocated GPUs, then hand the original command line to the low-level
// runtime.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/hostfs.hpp"
#include "common/log.hpp"
#include "gpu/gpu.hpp"
#include "runtime/allocation.hpp"
#include "runtime/config.hpp"
#include "runtime/host_devices.hpp"
#include "runtime/isolation.hpp"
#include "runtime/mount_table.hpp"
#include "runtime/runc_args.hpp"

namespace gpufence {

using InventoryFactory = std::function<Result<std::unique_ptr<GpuInventory>>()>;
// The host's NVML (dlopen'ed from `nvml_library`, config or default), opened when first needed.
InventoryFactory host_nvml_inventory(std::string nvml_library);

// Whether the flow applies CDI edits itself (the shim, which sees the spec as runc will) or the
// runtime already injected them (gpufence-nri: containerd's CRI injects CDI devices before NRI
// sees the container, docs/nri.md).
enum class CdiEdits { apply, already_injected };

// Reads the host's device facts one decision needs (host_devices.hpp).
using HostDeviceReader = std::function<HostDeviceFacts(const HostDeviceQuery&)>;

// One per invocation: what the flow needs from the outside world.
struct ShimContext {
  RuntimeConfig config;
  Logger& log;
  InventoryFactory open_inventory;  // NVML, or a fake in tests
  std::string self_exe;             // absolute path of gpufence-runtime, for the hooks it adds
  CdiEdits cdi_edits = CdiEdits::apply;
  // The host's device facts; empty: read under config.device_root. Tests give a table.
  HostDeviceReader read_host_devices = {};
  // The host's cgroup mount points kept between decisions (gpufence-nri); null: read each time.
  CgroupMountPoints* cgroup_mounts = nullptr;
};

struct ShimDecision {
  std::string container_id;
  Channel channel = Channel::none;
  // The spec's device cgroup admits every device (admits_all_devices: what containerd makes of a
  // privileged pod). Logged under the key "privileged", which scripts and docs grep.
  bool admits_all_devices = false;
  bool passthrough = false;  // admits all, nothing requested, policy passthrough: spec untouched
  std::vector<std::string> granted;  // UUIDs
  std::vector<std::string> removed_nodes;
  std::vector<std::string> ignored;  // what untrusted channels asked for
  bool whitelisted = false;
  bool spec_changed = false;
  std::vector<std::string> cdi_devices;    // CDI devices applied, with their spec files
  std::vector<std::string> cdi_mounts;     // mounts the CDI edits added, "destination<-source"
  std::vector<std::string> granted_nodes;  // every device node granted, "path=c195:1"
  std::string inventory_source;  // "driver-procfs", "nvml", or "" when no GPU list was needed
};

// The steps of prepare_bundle, each testable on its own.
// config.json's text as a spec, refused when malformed or when a field we read has the wrong type;
// `where` names it in errors.
Result<Json> parse_spec(std::string_view text, std::string_view where);
Result<Json> read_spec(const std::filesystem::path& spec_path);
// mount_guard.hpp's check against this host's cgroup mounts (/proc/self/mountinfo): `kept` when
// given, else read now.
Status refuse_cgroupfs_binds_on_host(const Json& spec, CgroupMountPoints* kept);
// The node's GPUs, only when the channels name any: the driver's procfs when it can answer, NVML
// when indices are involved or procfs is absent.
Result<std::vector<Gpu>> load_inventory(const AllocationChannels& channels, const HostFs& host,
                                        ShimContext& ctx, std::string& source);
// What plan_isolation needs from the host for `granted`: their nodes, the control nodes, and the
// DRM list when the spec admits every device or names a DRM node.
HostDeviceQuery host_device_query(const Json& spec, const std::vector<Gpu>& granted,
                                  const RuntimeConfig& cfg);
// What to grant, keep and deny on this host for `granted` (plus nodes a CDI spec added), judged
// by the facts alone: a pure function.
Result<IsolationPlan> plan_isolation(const Json& spec, const std::vector<Gpu>& granted,
                                     const std::vector<DeviceNode>& extra_nodes,
                                     const HostDeviceFacts& facts, const RuntimeConfig& cfg);
// The createContainer hook that narrows the driver's GPU list inside the container.
Json driver_procfs_hook(const std::string& self_exe, const std::string& procfs_dir,
                        const std::vector<Gpu>& granted);
// The createContainer hook that refuses a cgroup filesystem the runtime did not mount itself
// (check_container_cgroup_mounts), added last to every unprivileged container's spec.
Json cgroup_mounts_hook(const std::string& self_exe);
// Gives every hook without `env` the fixed hook environment and every hook without `timeout`
// kDefaultHookTimeoutSeconds (cdi/hook_defaults.hpp): runc and crun would otherwise run a
// hook with the container's environment, as host root. Returns whether anything changed.
bool pin_hook_environments(Json& spec);
// Atomically replaces config.json (temp + fsync + rename) with the edited spec.
Status write_spec(const std::filesystem::path& spec_path, const Json& spec);

// Steps 2-11 of prepare_bundle on a spec in memory: the one decision and edit, shared by the shim
// and gpufence-nri (which turns the edit into an NRI adjustment). Returns whether `spec` changed;
// on error `spec` may be half edited and must be discarded. `where` names the spec in errors.
Result<bool> edit_spec(Json& spec, ShimContext& ctx, ShimDecision& decision,
                       std::string_view where);

// Reads, edits and atomically rewrites <bundle>/config.json. On any error config.json is left
// byte-for-byte as it was and the container must not be started.
Result<ShimDecision> prepare_bundle(const RuncInvocation& inv, ShimContext& ctx);

// The low-level runtime's absolute path: config value, searched on PATH when it has no '/'.
// Refuses gpufence-runtime itself, which would loop forever.
Result<std::string> resolve_low_level_runtime(const std::string& configured);

}  // namespace gpufence
