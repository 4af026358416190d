// GpuInventory backed by the NVIDIA driver's libnvidia-ml.so.1, always loaded with dlopen so the
// binaries start on nodes without a driver and tests can point them at tools/mock-nvml.
#pragma once

#include <memory>
#include <string>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "gpu/gpu.hpp"

struct nvmlDevice_st;

namespace gpufence {

inline constexpr const char* kNvmlDefaultLibrary = "libnvidia-ml.so.1";
inline constexpr const char* kNvmlLibraryEnv = "GPUFENCE_NVML_LIBRARY";

// The library to load: the flag if given, else $GPUFENCE_NVML_LIBRARY, else libnvidia-ml.so.1.
std::string nvml_library_path(const std::string& flag_value);

class NvmlInventory final : public GpuInventory {
 public:
  // dlopens `library`, resolves the versioned symbols and calls nvmlInit_v2. `host` is used to
  // read a PCI device's NUMA node from sysfs when NVML cannot tell.
  static Result<std::unique_ptr<NvmlInventory>> open(const std::string& library,
                                                     const HostFs& host);
  ~NvmlInventory() override;

  const std::string& driver_version() const { return m_driver_version; }

  Result<std::vector<Gpu>> gpus() override;
  Result<std::vector<GpuProcess>> processes(const std::string& uuid) override;
  Result<Topology> topology(const std::string& uuid_a, const std::string& uuid_b) override;
  Status check_alive(const std::string& uuid) override;
  Result<GpuRecoveryAction> recovery_action(const std::string& uuid) override;
  Result<std::optional<GpuEvent>> wait_event(std::chrono::milliseconds timeout) override;
  std::vector<EventRegistrationFailure> event_registration_failures() override;

  struct Api;  // resolved function pointers; defined in the .cpp

 private:
  NvmlInventory(void* handle, std::unique_ptr<Api> api, HostFs host);
  Error error(std::string_view op, int code) const;
  Result<::nvmlDevice_st*> handle(const std::string& uuid) const;
  Status ensure_events();

  void* m_handle;
  std::unique_ptr<Api> m_api;
  HostFs m_host;
  std::string m_driver_version;
  struct Events;
  std::unique_ptr<Events> m_events;
};

}  // namespace gpufence
