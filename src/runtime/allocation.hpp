// Where a container's GPU allocation comes from: only channels a pod cannot forge, in the order
// NVIDIA's toolkit reads them (internal/config/image/cuda_image.go VisibleDevices):
//   1. CDI annotations (cdi.k8s.io/<x> = nvidia.com/gpu=<id>,...): written by the device plugin,
//      they reach the spec only through containerd's container_annotations allow-list;
//   2. mount markers (/dev/null mounted at /var/run/nvidia-container-devices/<id>): added by the
//      kubelet from the plugin's Allocate answer;
//   3. NVIDIA_VISIBLE_DEVICES, only for privileged containers or when the config trusts env.
//      Its "all" is never an allocation: CUDA base images set it for every container.
#pragma once

#include <string_view>
#include <vector>

#include "gpu/selector.hpp"
#include "runtime/config.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

enum class Channel { none, cdi_annotations, mount_markers, envvar };
std::string_view channel_name(Channel channel);

struct AllocationRequest {
  Channel channel = Channel::none;
  std::vector<DeviceToken> tokens;  // empty: no GPU
  std::string ignored;              // what was seen and deliberately not honoured, for the log
};

// Any malformed id on a trusted channel is an error: the container must not start on a guess.
Result<AllocationRequest> find_allocation_request(const Json& spec, const RuntimeConfig& cfg,
                                                  bool privileged);

}  // namespace gpufence
