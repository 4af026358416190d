// The GPU model every component shares, and the GpuInventory seam behind which NVML (or a test
// fake) answers.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct Gpu {
  unsigned index = 0;              // NVML index: not stable across reboots, key on uuid instead
  std::string uuid;                // "GPU-xxxxxxxx-xxxx-..."
  std::string name;                // "NVIDIA GeForce RTX 3080"
  unsigned minor = 0;              // /dev/nvidia<minor>
  std::string pci_bus_id;          // "00000000:01:00.0"
  std::uint64_t memory_total = 0;  // bytes
  std::optional<int> numa_node;    // host NUMA node of the PCI device; nullopt when unknown
  std::string driver_version;

  std::string device_path() const { return "/dev/nvidia" + std::to_string(minor); }
};

struct GpuProcess {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_memory;  // bytes; nullopt when NVML says "not available"
};

// How two GPUs are connected, best first. Values follow NVML's nvmlGpuTopologyLevel_t order.
enum class Link {
  nvlink,           // at least one active NVLink between them
  internal,         // same board (multi-GPU card)
  single_switch,    // one PCIe switch
  multiple_switch,  // several PCIe switches, no host bridge
  host_bridge,      // same host bridge
  numa_node,        // same NUMA node, across host bridges
  system,           // across NUMA nodes (SMP interconnect)
  unknown,
};

struct Topology {
  Link link = Link::unknown;
  unsigned nvlinks = 0;  // number of active NVLinks between the pair
};

// A health event from the driver: a critical XID or a GPU that fell off the bus.
struct GpuEvent {
  std::string uuid;  // empty when the driver could not say which GPU
  std::uint64_t xid = 0;
  bool gpu_lost = false;
};

// A GPU whose health events could not be registered: its XIDs go unseen.
struct EventRegistrationFailure {
  std::string uuid;
  std::string error;
};

// What the driver says a GPU needs after a fault: NVML's nvmlDeviceGpuRecoveryAction_t, read
// as the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230) on drivers that have it; XID 154 is
// raised when it changes (docs/monitoring.md, "Health").
enum class GpuRecoveryAction {
  none = 0,             // healthy as far as the driver knows
  gpu_reset = 1,        // reset the GPU
  node_reboot = 2,      // reboot the node
  drain_p2p = 3,        // stop peer-to-peer traffic, then ask again
  drain_and_reset = 4,  // reduced capacity: drain the work, then reset
  other = 5,            // a value this release does not know
};
// The metric's and the log's name of an action: none, gpu_reset, node_reboot, drain_p2p,
// drain_and_reset, other.
constexpr std::string_view recovery_action_name(GpuRecoveryAction a) {
  switch (a) {
    case GpuRecoveryAction::none:
      return "none";
    case GpuRecoveryAction::gpu_reset:
      return "gpu_reset";
    case GpuRecoveryAction::node_reboot:
      return "node_reboot";
    case GpuRecoveryAction::drain_p2p:
      return "drain_p2p";
    case GpuRecoveryAction::drain_and_reset:
      return "drain_and_reset";
    case GpuRecoveryAction::other:
      return "other";
  }
  return "other";
}

class GpuInventory {
 public:
  virtual ~GpuInventory() = default;
  virtual Result<std::vector<Gpu>> gpus() = 0;
  virtual Result<std::vector<GpuProcess>> processes(const std::string& uuid) = 0;
  virtual Result<Topology> topology(const std::string& uuid_a, const std::string& uuid_b) = 0;
  // Whether the GPU answers the driver now (used to recover an Unhealthy GPU).
  virtual Status check_alive(const std::string& uuid) = 0;
  // Waits up to `timeout` for the next XID/lost event on any GPU; nullopt on timeout.
  virtual Result<std::optional<GpuEvent>> wait_event(std::chrono::milliseconds timeout) = 0;
  // The driver's recovery action for the GPU; Errc::unsupported where the driver or library
  // has none (before R565, or the field is not supported on that GPU).
  virtual Result<GpuRecoveryAction> recovery_action(const std::string& uuid) {
    return fail(Errc::unsupported, "no GPU recovery action for ", uuid);
  }
  // The GPUs left out of the event stream when wait_event armed it, each with why.
  virtual std::vector<EventRegistrationFailure> event_registration_failures() { return {}; }
};

}  // namespace gpufence
