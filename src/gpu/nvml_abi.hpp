// NVML's C ABI, declared by hand because no nvml.h is installed. Every layout and constant here
// follows nvml.h as recorded in docs/nvml.md (checked against the headers of drivers
// 520.56.06, 535.104.05, 550.40.07 and CUDA 13.x). The static_asserts pin the x86_64 layouts.
// Shared by the loader (src/gpu/nvml_inventory.cpp) and the mock library (tools/mock-nvml).
#pragma once

#include <cstddef>

extern "C" {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlEventSet_t = struct nvmlEventSet_st*;
using nvmlEnableState_t = int;
using nvmlGpuTopologyLevel_t = int;

// nvmlPciInfo_t as filled by nvmlDeviceGetPciInfo_v3 (layout unchanged since 415.13).
struct nvmlPciInfo_t {
  char busIdLegacy[16];  // "%04X:%02X:%02X.0"
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // "%08X:%02X:%02X.0"
};

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// Legacy 16-byte record of the plain nvmlDeviceGetComputeRunningProcesses.
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};

// 24-byte record of _v2 and _v3 (except the 535.43-535.86 headers, which wrote 32 bytes).
struct nvmlProcessInfo_v2_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

// 32-byte record of nvmlEventSetWait_v2.
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;  // the Xid for XidCriticalError
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

// nvmlFieldValue_t: one field asked of nvmlDeviceGetFieldValues; value is a union of 8 bytes.
struct nvmlFieldValue_t {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;  // nvmlValueType_t: 1 = unsigned int
  nvmlReturn_t nvmlReturn;
  unsigned long long value;  // uiVal in its low 4 bytes (little-endian), ullVal whole
};

}  // extern "C"

static_assert(sizeof(nvmlPciInfo_t) == 68 && offsetof(nvmlPciInfo_t, busId) == 36);
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlProcessInfo_v1_t) == 16);
static_assert(sizeof(nvmlProcessInfo_v2_t) == 24 &&
              offsetof(nvmlProcessInfo_v2_t, gpuInstanceId) == 16);
static_assert(sizeof(nvmlFieldValue_t) == 40 && offsetof(nvmlFieldValue_t, value) == 32);
static_assert(sizeof(nvmlEventData_t) == 32 && offsetof(nvmlEventData_t, eventData) == 16);

namespace gpufence::nvml {

inline constexpr nvmlReturn_t SUCCESS = 0;
inline constexpr nvmlReturn_t ERROR_UNINITIALIZED = 1;
inline constexpr nvmlReturn_t ERROR_INVALID_ARGUMENT = 2;
inline constexpr nvmlReturn_t ERROR_NOT_SUPPORTED = 3;
inline constexpr nvmlReturn_t ERROR_NO_PERMISSION = 4;
inline constexpr nvmlReturn_t ERROR_NOT_FOUND = 6;
inline constexpr nvmlReturn_t ERROR_INSUFFICIENT_SIZE = 7;
inline constexpr nvmlReturn_t ERROR_DRIVER_NOT_LOADED = 9;
inline constexpr nvmlReturn_t ERROR_TIMEOUT = 10;
inline constexpr nvmlReturn_t ERROR_LIBRARY_NOT_FOUND = 12;
inline constexpr nvmlReturn_t ERROR_FUNCTION_NOT_FOUND = 13;
inline constexpr nvmlReturn_t ERROR_GPU_IS_LOST = 15;
inline constexpr nvmlReturn_t ERROR_UNKNOWN = 999;

inline constexpr unsigned kUuidBufferSize = 96;     // NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned kVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
inline constexpr unsigned kMaxNvLinks = 36;         // NVML_NVLINK_MAX_LINKS in the CUDA 13.3 header
inline constexpr unsigned long long kValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

inline constexpr unsigned long long kEventSingleBitEcc = 0x1;
inline constexpr unsigned long long kEventDoubleBitEcc = 0x2;
inline constexpr unsigned long long kEventXidCritical = 0x8;

inline constexpr int TOPOLOGY_INTERNAL = 0;
inline constexpr int TOPOLOGY_SINGLE = 10;
inline constexpr int TOPOLOGY_MULTIPLE = 20;
inline constexpr int TOPOLOGY_HOSTBRIDGE = 30;
inline constexpr int TOPOLOGY_NODE = 40;
inline constexpr int TOPOLOGY_SYSTEM = 50;

inline constexpr int FEATURE_ENABLED = 1;

inline constexpr unsigned kFieldGpuRecoveryAction = 230;  // NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
inline constexpr int kValueTypeUnsignedInt = 1;           // NVML_VALUE_TYPE_UNSIGNED_INT

}  // namespace gpufence::nvml
