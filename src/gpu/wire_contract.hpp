// The one definition of what gpufence-device-plugin's Allocate answer carries and what
// gpufence-runtime, gpufence launch and `gpufence cdi generate` read back. Both sides include
// this header, so a change of form cannot reach one side only. The channels and why each is or is
// not trusted are in docs/trust-model.md.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "common/paths.hpp"

namespace gpufence {

// Where gpufence-runtime is on the host: the stable link `gpufence install` makes, which a
// containerd handler's BinaryName and the CDI specs' hooks name (runc runs it by this path).
inline constexpr std::string_view kRuntimeBinaryPath = paths::kRuntimeBinary;

// The extended resource the device plugin advertises and pods request.
inline constexpr std::string_view kGpuResourceName = "nvidia.com/gpu";

// CDI kind of every GPU device gpufence's device plugin names ("gpufence.io/gpu=<uuid>") and of
// the spec it writes. A vendor of gpufence's own: NVIDIA's toolkit (`nvidia-ctk cdi generate`, its
// refresh unit, the GPU Operator) writes kind nvidia.com/gpu with the same names (indices, UUIDs,
// "all") into /var/run/cdi, and the CDI cache drops a name two specs of one directory define
// (docs/cdi.md, "Conflicts"). NVIDIA's own device plugin avoids that the same way
// (k8s.device-plugin.nvidia.com/gpu).
inline constexpr std::string_view kCdiKind = "gpufence.io/gpu";
// NVIDIA's kind: the shim, launch, the doctor and `gpufence cdi generate` read its names too (an
// Allocate answer checkpointed by an older plugin, a spec of NVIDIA's toolkit).
inline constexpr std::string_view kNvidiaCdiKind = "nvidia.com/gpu";
inline constexpr std::array<std::string_view, 2> kGpuCdiKinds = {kCdiKind, kNvidiaCdiKind};

inline bool is_gpu_cdi_kind(std::string_view kind) {
  return std::find(kGpuCdiKinds.begin(), kGpuCdiKinds.end(), kind) != kGpuCdiKinds.end();
}

// A fully qualified CDI device name, "<kind>=<name>".
struct CdiName {
  std::string_view kind;
  std::string_view name;
};
// "kind=name" split at the first '='; nullopt when there is none.
inline std::optional<CdiName> split_cdi_name(std::string_view qualified) {
  auto eq = qualified.find('=');
  if (eq == std::string_view::npos) return std::nullopt;
  return CdiName{qualified.substr(0, eq), qualified.substr(eq + 1)};
}
// The name the device plugin gives one GPU: "gpufence.io/gpu=<id>".
inline std::string gpu_cdi_name(std::string_view id) {
  std::string out(kCdiKind);
  out += '=';
  out += id;
  return out;
}
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
