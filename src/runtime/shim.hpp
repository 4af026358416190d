// gpufence-runtime's flow: on create/run, rewrite the bundle's config.json so the container gets
// exactly its allocated GPUs, then hand the original command line to the low-level runtime.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "gpu/gpu.hpp"
#include "runtime/allocation.hpp"
#include "runtime/config.hpp"
#include "runtime/runc_args.hpp"

namespace gpufence {

using InventoryFactory = std::function<Result<std::unique_ptr<GpuInventory>>()>;

// One per invocation: what the flow needs from the outside world.
struct ShimContext {
  RuntimeConfig config;
  Logger& log;
  InventoryFactory open_inventory;
};

struct ShimDecision {
  std::string container_id;
  Channel channel = Channel::none;
  bool privileged = false;
  bool passthrough = false;  // privileged, nothing requested, policy passthrough: spec untouched
  std::vector<std::string> granted;  // UUIDs
  std::vector<unsigned> denied_minors;
  bool spec_changed = false;
  std::vector<std::string> cdi_devices;  // CDI devices applied, with their spec files
  std::string inventory_source;  // "driver-procfs", "nvml", or "" when no GPU list was needed
};

// Reads, edits and atomically rewrites <bundle>/config.json. On any error config.json is left
// byte-for-byte as it was and the container must not be started.
Result<ShimDecision> prepare_bundle(const RuncInvocation& inv, ShimContext& ctx);

// The low-level runtime's absolute path: config value, searched on PATH when it has no '/'.
// Refuses gpufence-runtime itself, which would loop forever.
Result<std::string> resolve_low_level_runtime(const std::string& configured);

}  // namespace gpufence
