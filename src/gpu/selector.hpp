// Device selectors: every form users write in NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES,
// mount markers and CDI names, parsed from literal strings and resolved against an inventory.
//
// Forms (NVIDIA container toolkit README and internal/config/image/devices.go):
//   unset, "" or "void"  -> no request at all ("same behaviour as runc")
//   "none"               -> no GPU, driver capabilities still wanted
//   "all"                -> every GPU
//   "0,1"                -> NVML indices
//   "GPU-<uuid>"         -> UUIDs, or unique prefixes of them as CUDA accepts
//   "gpufence.io/gpu=X", "nvidia.com/gpu=X" -> CDI names (kGpuCdiKinds), X an index, UUID or "all"
//   "/var/run/nvidia-container-devices" -> the volume-mounts strategy: read the mount markers
//   "0:1", "MIG-..."     -> MIG devices: recognised and rejected, not supported yet
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "gpu/gpu.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

// UUIDs fit NVML_DEVICE_UUID_V2_BUFFER_SIZE (96, NUL included); anything longer is garbage.
inline constexpr size_t kMaxDeviceTokenLength = 95;

struct DeviceToken {
  enum class Kind { index, uuid, all };
  Kind kind = Kind::index;
  unsigned index = 0;
  std::string uuid;      // full or prefix, "GPU-..."
  std::string text;      // the token as written, for error messages
  std::string cdi_kind;  // the kind when written as a CDI name ("gpufence.io/gpu"), else ""

  // The device id as written, without "<kind>=": "1", "GPU-ab12", "all".
  std::string_view id() const {
    return cdi_kind.empty() ? std::string_view(text)
                            : std::string_view(text).substr(cdi_kind.size() + 1);
  }
};

struct DeviceSelector {
  enum class Kind { unset, none, all, list, volume_mounts };
  Kind kind = Kind::unset;
  std::vector<DeviceToken> tokens;  // for Kind::list
};

// One device: "1", "GPU-ab12", "gpufence.io/gpu=1", "nvidia.com/gpu=all".
Result<DeviceToken> parse_device_token(std::string_view token);
// A whole NVIDIA_VISIBLE_DEVICES-style value.
Result<DeviceSelector> parse_device_selector(std::string_view value);

// The GPUs a token names. Errors name the token: unknown index/UUID, ambiguous UUID prefix.
Result<std::vector<Gpu>> resolve_token(const DeviceToken& token, const std::vector<Gpu>& inventory);
// The GPUs a selector names, in the order written; a GPU named twice is an error.
Result<std::vector<Gpu>> resolve_selector(const DeviceSelector& selector,
                                          const std::vector<Gpu>& inventory);

}  // namespace gpufence
