// The Allocate answer for one container, as a pure function of the GPUs granted and the
// channels chosen. It must carry the allocation through channels a pod cannot forge (device
// specs, mount markers, CDI names) so gpufence-runtime can enforce it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/hostfs.hpp"
#include "deviceplugin/api.hpp"
#include "deviceplugin/options.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

struct PluginDevice {
  std::string id;  // what the kubelet sees: UUID or index, per --device-id-strategy
  Gpu gpu;
};

std::string plugin_device_id(const Gpu& gpu, DeviceIdStrategy strategy);

// Every id must be known and healthy, and named once; the error names the first bad id.
// `healthy` answers for a UUID.
Result<std::vector<Gpu>> validate_allocation(
    const std::vector<std::string>& ids, const std::vector<PluginDevice>& devices,
    const std::function<bool(const std::string&)>& healthy);

struct HostNode {
  std::string container_path;  // "/dev/nvidiactl"
  std::string host_path;       // the node's path on the host, as the kubelet resolves it
};

// The NVIDIA control nodes (/dev/nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset) that
// are character devices under `host`'s root, each named by its host path: --host-root changes
// where we look, never what we answer.
std::vector<HostNode> present_control_nodes(const HostFs& host);

// `control_nodes` are the control nodes present on the host. A GPU node's host path is its
// path on the host, /dev/nvidia<minor>: the kubelet and the runtime resolve DeviceSpec host
// paths in the host's mount namespace, never under the root this process sees the host at.
v1beta1::ContainerAllocateResponse build_allocate_response(
    const std::vector<Gpu>& gpus, const PluginOptions& options,
    const std::vector<HostNode>& control_nodes);

}  // namespace gpufence
