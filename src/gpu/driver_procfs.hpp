// The kernel driver's own GPU list: /proc/driver/nvidia/gpus/<bus id>/information. Reading it
// costs a few file reads, where nvmlInit opens the driver and, without persistence mode, can
// initialise every GPU (tens of ms to seconds, docs/nvidia-devices.md). The runtime shim uses
// it on the container-create hot path when every requested id is a UUID; NVML stays the source
// for everything else (indices, processes, topology, health).
#pragma once

#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

inline constexpr std::string_view kDriverGpusDir = "/proc/driver/nvidia/gpus";

// Parses one "information" file ("Model:", "GPU UUID:", "Bus Location:", "Device Minor:").
Result<Gpu> parse_driver_gpu_information(std::string_view text);

// The entry name of a GPU under /proc/driver/nvidia/gpus: "00000000:3B:00.0" -> "0000:3b:00.0".
std::string driver_gpu_entry_name(std::string_view pci_bus_id);

// Every GPU the driver lists, in PCI bus order (the order NVML numbers them by default; the
// index is that position). not_found when the driver's procfs is absent.
Result<std::vector<Gpu>> read_driver_gpus(const HostFs& host);

}  // namespace gpufence
