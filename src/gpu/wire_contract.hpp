// The one definition of what gpufence-device-plugin's Allocate answer carries and what
// gpufence-runtime, gpufence launch and `gpufence cdi generate` read back. Both sides include
// this header, so a change of form cannot reach one side only. The channels and why each is or is
// not trusted are in docs/trust-model.md.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace gpufence {

// CDI kind of every GPU device gpufence names ("nvidia.com/gpu=<uuid>").
inline constexpr std::string_view kCdiKind = "nvidia.com/gpu";
// The kubelet mounts /dev/null at <root>/<uuid> for each GPU in the Allocate answer's mounts
// (the volume-mounts form NVIDIA's toolkit reads).
inline constexpr std::string_view kMountMarkerRoot = "/var/run/nvidia-container-devices";
// Container annotations under this prefix name CDI devices (CDI spec, "Kubernetes annotations").
inline constexpr std::string_view kCdiAnnotationPrefix = "cdi.k8s.io/";
// One annotation per allocation: <prefix>gpufence_<first uuid>. GPUs are exclusive, so the first
// UUID makes the key unique on the node.
inline std::string allocation_annotation_key(std::string_view prefix, std::string_view first_uuid) {
  return std::string(prefix) + "gpufence_" + std::string(first_uuid);
}

// NVIDIA's character devices (docs/nvidia-devices.md): major 195 holds the GPUs (minors 0..253),
// /dev/nvidia-modeset (254) and /dev/nvidiactl (255); nvidia-uvm and nvidia-caps get dynamic
// majors, named in /proc/devices.
inline constexpr unsigned kNvidiaMajor = 195;
inline constexpr unsigned kNvidiaMaxGpuMinor = 253;
inline constexpr unsigned kNvidiaModesetMinor = 254;
inline constexpr unsigned kNvidiaCtlMinor = 255;
inline constexpr unsigned kDrmMajor = 226;

// The control nodes a container granted a GPU also needs, and the driver capability
// (NVIDIA_DRIVER_CAPABILITIES) that asks for each; "" = always with a GPU.
struct ControlNode {
  std::string_view path;
  std::string_view capability;
};
inline constexpr std::array<ControlNode, 4> kControlNodes = {{
    {"/dev/nvidiactl", ""},
    {"/dev/nvidia-uvm", ""},
    {"/dev/nvidia-uvm-tools", "compute"},
    {"/dev/nvidia-modeset", "display"},
}};

}  // namespace gpufence
