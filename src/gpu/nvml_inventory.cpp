#include "gpu/nvml_inventory.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>

#include "common/strings.hpp"
#include "gpu/nvml_abi.hpp"

namespace gpufence {

using ErrorStringFn = const char* (*)(nvmlReturn_t);
using VoidFn = nvmlReturn_t (*)();
using StringFn = nvmlReturn_t (*)(char*, unsigned);
using CountFn = nvmlReturn_t (*)(unsigned*);
using HandleByIndexFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using HandleByUuidFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using DeviceStringFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using DeviceUintFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*);
using PciInfoFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*);
using MemoryFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using ProcessesFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*, void*);
using CommonAncestorFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t, nvmlGpuTopologyLevel_t*);
using NvLinkStateFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlEnableState_t*);
using NvLinkRemotePciFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlPciInfo_t*);
using EventSetCreateFn = nvmlReturn_t (*)(nvmlEventSet_t*);
using RegisterEventsFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
using SupportedEventsFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long*);
using EventWaitFn = nvmlReturn_t (*)(nvmlEventSet_t, nvmlEventData_t*, unsigned);
using EventSetFreeFn = nvmlReturn_t (*)(nvmlEventSet_t);
using FieldValuesFn = nvmlReturn_t (*)(nvmlDevice_t, int, nvmlFieldValue_t*);

// Versioned names only: the plain names are legacy ABIs (docs/nvml.md §2.1).
struct NvmlInventory::Api {
  ErrorStringFn error_string = nullptr;
  VoidFn init = nullptr;
  VoidFn shutdown = nullptr;
  StringFn driver_version = nullptr;
  CountFn count = nullptr;
  HandleByIndexFn handle_by_index = nullptr;
  HandleByUuidFn handle_by_uuid = nullptr;
  DeviceStringFn uuid = nullptr;
  DeviceStringFn name = nullptr;
  DeviceUintFn minor = nullptr;
  PciInfoFn pci_info = nullptr;
  MemoryFn memory = nullptr;
  // Optional: absent on older drivers.
  DeviceUintFn index = nullptr;
  DeviceUintFn numa_node = nullptr;  // 550.40.07+
  ProcessesFn processes = nullptr;
  size_t process_record_size = 0;  // 24 for _v3/_v2, 16 for the plain legacy symbol
  CommonAncestorFn common_ancestor = nullptr;
  NvLinkStateFn nvlink_state = nullptr;
  NvLinkRemotePciFn nvlink_remote_pci = nullptr;
  EventSetCreateFn event_set_create = nullptr;
  RegisterEventsFn register_events = nullptr;
  SupportedEventsFn supported_events = nullptr;
  EventWaitFn event_wait = nullptr;
  EventSetFreeFn event_set_free = nullptr;
  FieldValuesFn field_values = nullptr;  // R450+; the recovery action field R565+
};

struct NvmlInventory::Events {
  nvmlEventSet_t set = nullptr;
  std::map<nvmlDevice_t, std::string> uuids;
  std::vector<EventRegistrationFailure> failures;
};

std::string nvml_library_path(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv(kNvmlLibraryEnv); env && *env) return env;
  return kNvmlDefaultLibrary;
}

namespace {

template <class Fn>
Fn symbol(void* handle, const char* name) {
  return reinterpret_cast<Fn>(::dlsym(handle, name));
}

std::string from_buffer(const char* buf, size_t size) {
  return std::string(buf, ::strnlen(buf, size));
}

// The 535.43.02-535.86.05 libraries wrote 32-byte records through _v3 (docs/nvml.md §3.4).
bool has_broken_v3_processes(std::string_view driver) {
  return driver == "535.43.02" || driver == "535.54.03" || driver == "535.86.05";
}

// sysfs names PCI devices "dddd:bb:dd.f" in lower case; NVML says "0000dddd:BB:DD.F".
std::string sysfs_pci_name(std::string_view bus_id) {
  std::string id = to_lower(bus_id);
  if (id.size() == 16) id = id.substr(4);
  return id;
}

Link link_from_level(int level) {
  switch (level) {
    case nvml::TOPOLOGY_INTERNAL:
      return Link::internal;
    case nvml::TOPOLOGY_SINGLE:
      return Link::single_switch;
    case nvml::TOPOLOGY_MULTIPLE:
      return Link::multiple_switch;
    case nvml::TOPOLOGY_HOSTBRIDGE:
      return Link::host_bridge;
    case nvml::TOPOLOGY_NODE:
      return Link::numa_node;
    case nvml::TOPOLOGY_SYSTEM:
      return Link::system;
    default:
      return Link::unknown;
  }
}

}  // namespace

Result<std::unique_ptr<NvmlInventory>> NvmlInventory::open(const std::string& library,
                                                           const HostFs& host) {
  // RTLD_LAZY | RTLD_GLOBAL as NVIDIA's go-nvml loads it.
  void* handle = ::dlopen(library.c_str(), RTLD_LAZY | RTLD_GLOBAL);
  if (!handle) {
    const char* why = ::dlerror();
    return fail(Errc::nvml, "cannot load NVML library ", library, ": ", why ? why : "unknown error",
                " (is the NVIDIA driver installed? override with --nvml-library or $",
                kNvmlLibraryEnv, ")");
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto need = [&]<class Fn>(Fn& slot, const char* name) {
    slot = symbol<Fn>(handle, name);
    if (!slot) missing += missing.empty() ? name : std::string(", ") + name;
  };
  need(api->error_string, "nvmlErrorString");
  need(api->init, "nvmlInit_v2");
  need(api->shutdown, "nvmlShutdown");
  need(api->driver_version, "nvmlSystemGetDriverVersion");
  need(api->count, "nvmlDeviceGetCount_v2");
  need(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  need(api->handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  need(api->uuid, "nvmlDeviceGetUUID");
  need(api->name, "nvmlDeviceGetName");
  need(api->minor, "nvmlDeviceGetMinorNumber");
  need(api->pci_info, "nvmlDeviceGetPciInfo_v3");
  need(api->memory, "nvmlDeviceGetMemoryInfo");  // plain name is the current v1 API
  if (!missing.empty()) {
    ::dlclose(handle);
    return fail(Errc::nvml, "NVML library ", library, " lacks required symbol(s) ", missing,
                " (driver too old, or not libnvidia-ml)");
  }
  api->index = symbol<DeviceUintFn>(handle, "nvmlDeviceGetIndex");
  api->numa_node = symbol<DeviceUintFn>(handle, "nvmlDeviceGetNumaNodeId");
  api->common_ancestor = symbol<CommonAncestorFn>(handle, "nvmlDeviceGetTopologyCommonAncestor");
  api->nvlink_state = symbol<NvLinkStateFn>(handle, "nvmlDeviceGetNvLinkState");
  api->nvlink_remote_pci = symbol<NvLinkRemotePciFn>(handle, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  api->event_set_create = symbol<EventSetCreateFn>(handle, "nvmlEventSetCreate");
  api->register_events = symbol<RegisterEventsFn>(handle, "nvmlDeviceRegisterEvents");
  api->supported_events = symbol<SupportedEventsFn>(handle, "nvmlDeviceGetSupportedEventTypes");
  api->event_wait = symbol<EventWaitFn>(handle, "nvmlEventSetWait_v2");
  api->field_values = symbol<FieldValuesFn>(handle, "nvmlDeviceGetFieldValues");
  api->event_set_free = symbol<EventSetFreeFn>(handle, "nvmlEventSetFree");

  if (int rc = api->init(); rc != nvml::SUCCESS) {
    std::string why = api->error_string(rc) ? api->error_string(rc) : "unknown error";
    ::dlclose(handle);
    return fail(Errc::nvml, "nvmlInit_v2 failed: ", why, " (NVML error ", rc, ")");
  }

  std::unique_ptr<NvmlInventory> inv(new NvmlInventory(handle, std::move(api), host));
  char version[nvml::kVersionBufferSize] = {};
  if (int rc = inv->m_api->driver_version(version, sizeof version); rc != nvml::SUCCESS) {
    return std::unexpected(inv->error("nvmlSystemGetDriverVersion", rc));
  }
  inv->m_driver_version = from_buffer(version, sizeof version);

  // Process records: _v3, then _v2 (both 24 bytes), then the legacy plain symbol (16 bytes).
  Api& a = *inv->m_api;
  if (!has_broken_v3_processes(inv->m_driver_version)) {
    a.processes = symbol<ProcessesFn>(handle, "nvmlDeviceGetComputeRunningProcesses_v3");
  }
  if (!a.processes)
    a.processes = symbol<ProcessesFn>(handle, "nvmlDeviceGetComputeRunningProcesses_v2");
  a.process_record_size = sizeof(nvmlProcessInfo_v2_t);
  if (!a.processes) {
    a.processes = symbol<ProcessesFn>(handle, "nvmlDeviceGetComputeRunningProcesses");
    a.process_record_size = sizeof(nvmlProcessInfo_v1_t);
  }
  return inv;
}

NvmlInventory::NvmlInventory(void* handle, std::unique_ptr<Api> api, HostFs host)
    : m_handle(handle), m_api(std::move(api)), m_host(std::move(host)) {}

NvmlInventory::~NvmlInventory() {
  if (m_events && m_events->set && m_api->event_set_free) m_api->event_set_free(m_events->set);
  m_api->shutdown();
  ::dlclose(m_handle);
}

Error NvmlInventory::error(std::string_view op, int code) const {
  const char* text = m_api->error_string(code);
  return Error{Errc::nvml,
               cat(op, ": ", text ? text : "unknown error", " (NVML error ", code, ")")};
}

Result<nvmlDevice_t> NvmlInventory::handle(const std::string& uuid) const {
  nvmlDevice_t dev = nullptr;
  if (int rc = m_api->handle_by_uuid(uuid.c_str(), &dev); rc != nvml::SUCCESS) {
    return std::unexpected(error("nvmlDeviceGetHandleByUUID " + uuid, rc));
  }
  return dev;
}

Result<std::vector<Gpu>> NvmlInventory::gpus() {
  unsigned count = 0;
  if (int rc = m_api->count(&count); rc != nvml::SUCCESS) {
    return std::unexpected(error("nvmlDeviceGetCount_v2", rc));
  }
  std::vector<Gpu> out;
  out.reserve(count);
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    auto where = [&](std::string_view fn) { return cat(fn, " (GPU ", i, ")"); };
    if (int rc = m_api->handle_by_index(i, &dev); rc != nvml::SUCCESS) {
      return std::unexpected(error(where("nvmlDeviceGetHandleByIndex_v2"), rc));
    }
    Gpu gpu;
    gpu.index = i;
    if (m_api->index) {
      unsigned idx = i;
      if (m_api->index(dev, &idx) == nvml::SUCCESS) gpu.index = idx;
    }
    char buf[nvml::kUuidBufferSize] = {};
    if (int rc = m_api->uuid(dev, buf, sizeof buf); rc != nvml::SUCCESS) {
      return std::unexpected(error(where("nvmlDeviceGetUUID"), rc));
    }
    gpu.uuid = from_buffer(buf, sizeof buf);
    char name[nvml::kNameBufferSize] = {};
    if (int rc = m_api->name(dev, name, sizeof name); rc != nvml::SUCCESS) {
      return std::unexpected(error(where("nvmlDeviceGetName"), rc));
    }
    gpu.name = from_buffer(name, sizeof name);
    if (int rc = m_api->minor(dev, &gpu.minor); rc != nvml::SUCCESS) {
      return std::unexpected(error(where("nvmlDeviceGetMinorNumber"), rc));
    }
    nvmlPciInfo_t pci{};
    if (int rc = m_api->pci_info(dev, &pci); rc != nvml::SUCCESS) {
      return std::unexpected(error(where("nvmlDeviceGetPciInfo_v3"), rc));
    }
    gpu.pci_bus_id = from_buffer(pci.busId, sizeof pci.busId);
    nvmlMemory_t mem{};
    if (int rc = m_api->memory(dev, &mem); rc != nvml::SUCCESS) {
      return std::unexpected(error(where("nvmlDeviceGetMemoryInfo"), rc));
    }
    gpu.memory_total = mem.total;
    // NVML's NUMA id is only meaningful on coherent-memory systems; a PCIe GPU's node is sysfs's.
    unsigned numa = 0;
    if (m_api->numa_node && m_api->numa_node(dev, &numa) == nvml::SUCCESS) {
      gpu.numa_node = static_cast<int>(numa);
    } else if (auto text = m_host.read("/sys/bus/pci/devices/" + sysfs_pci_name(gpu.pci_bus_id) +
                                       "/numa_node")) {
      if (auto node = parse_number<int>(trim(*text)); node && *node >= 0) gpu.numa_node = *node;
    }
    gpu.driver_version = m_driver_version;
    out.push_back(std::move(gpu));
  }
  return out;
}

Result<std::vector<GpuProcess>> NvmlInventory::processes(const std::string& uuid) {
  if (!m_api->processes) return fail(Errc::nvml, "NVML library has no process query");
  auto dev = handle(uuid);
  if (!dev) return std::unexpected(dev.error());
  // Size the buffer, then fetch; the list is live, so grow and retry on INSUFFICIENT_SIZE.
  // Each slot gets 32 bytes so a wider writer than we expect cannot overrun it.
  unsigned capacity = 0;
  std::vector<unsigned char> buffer;
  for (int attempt = 0; attempt < 8; ++attempt) {
    unsigned count = capacity;
    buffer.assign(static_cast<size_t>(capacity) * 32 + 32, 0);
    int rc = m_api->processes(*dev, &count, capacity ? buffer.data() : nullptr);
    if (rc == nvml::SUCCESS) {
      std::vector<GpuProcess> out;
      for (unsigned i = 0; i < count; ++i) {
        const unsigned char* rec = buffer.data() + i * m_api->process_record_size;
        nvmlProcessInfo_v1_t head{};  // pid and usedGpuMemory sit at the same offsets in v1 and v2
        std::memcpy(&head, rec, sizeof head);
        GpuProcess p{head.pid, std::nullopt};
        if (head.usedGpuMemory != nvml::kValueNotAvailable) p.used_memory = head.usedGpuMemory;
        out.push_back(p);
      }
      return out;
    }
    if (rc != nvml::ERROR_INSUFFICIENT_SIZE) {
      return std::unexpected(error("nvmlDeviceGetComputeRunningProcesses " + uuid, rc));
    }
    capacity = count + 4;
  }
  return fail(Errc::nvml, "process list of ", uuid, " kept growing; gave up");
}

Result<Topology> NvmlInventory::topology(const std::string& uuid_a, const std::string& uuid_b) {
  auto a = handle(uuid_a);
  if (!a) return std::unexpected(a.error());
  auto b = handle(uuid_b);
  if (!b) return std::unexpected(b.error());
  Topology topo;
  if (m_api->nvlink_state && m_api->nvlink_remote_pci) {
    nvmlPciInfo_t peer{};
    if (int rc = m_api->pci_info(*b, &peer); rc != nvml::SUCCESS) {
      return std::unexpected(error("nvmlDeviceGetPciInfo_v3 " + uuid_b, rc));
    }
    std::string peer_bus = from_buffer(peer.busId, sizeof peer.busId);
    // The number of links grew across drivers (4..36): probe them all, skip the absent ones.
    for (unsigned link = 0; link < nvml::kMaxNvLinks; ++link) {
      nvmlEnableState_t active = 0;
      if (m_api->nvlink_state(*a, link, &active) != nvml::SUCCESS) continue;
      if (active != nvml::FEATURE_ENABLED) continue;
      nvmlPciInfo_t remote{};
      if (m_api->nvlink_remote_pci(*a, link, &remote) != nvml::SUCCESS) continue;
      if (from_buffer(remote.busId, sizeof remote.busId) == peer_bus) ++topo.nvlinks;
    }
  }
  if (topo.nvlinks > 0) {
    topo.link = Link::nvlink;
    return topo;
  }
  if (m_api->common_ancestor) {
    nvmlGpuTopologyLevel_t level = 0;
    int rc = m_api->common_ancestor(*a, *b, &level);
    if (rc == nvml::SUCCESS)
      topo.link = link_from_level(level);
    else if (rc != nvml::ERROR_NOT_SUPPORTED) {
      return std::unexpected(error("nvmlDeviceGetTopologyCommonAncestor", rc));
    }
  }
  return topo;
}

Status NvmlInventory::check_alive(const std::string& uuid) {
  auto dev = handle(uuid);
  if (!dev) return std::unexpected(dev.error());
  char buf[nvml::kUuidBufferSize] = {};
  if (int rc = m_api->uuid(*dev, buf, sizeof buf); rc != nvml::SUCCESS) {
    return std::unexpected(error("nvmlDeviceGetUUID " + uuid, rc));
  }
  return {};
}

Result<GpuRecoveryAction> NvmlInventory::recovery_action(const std::string& uuid) {
  if (!m_api->field_values)
    return fail(Errc::unsupported, "NVML library has no nvmlDeviceGetFieldValues");
  auto dev = handle(uuid);
  if (!dev) return std::unexpected(dev.error());
  nvmlFieldValue_t field{};
  field.fieldId = nvml::kFieldGpuRecoveryAction;
  if (int rc = m_api->field_values(*dev, 1, &field); rc != nvml::SUCCESS)
    return std::unexpected(error("nvmlDeviceGetFieldValues " + uuid, rc));
  if (field.nvmlReturn == nvml::ERROR_NOT_SUPPORTED ||
      field.nvmlReturn == nvml::ERROR_INVALID_ARGUMENT)
    return fail(Errc::unsupported, "the driver reports no GPU recovery action for ", uuid);
  if (field.nvmlReturn != nvml::SUCCESS)
    return std::unexpected(error("GPU recovery action of " + uuid, field.nvmlReturn));
  auto value = static_cast<unsigned>(field.value & 0xffffffffu);
  return value <= 4 ? static_cast<GpuRecoveryAction>(value) : GpuRecoveryAction::other;
}

Status NvmlInventory::ensure_events() {
  if (m_events) return {};
  if (!m_api->event_set_create || !m_api->register_events || !m_api->event_wait) {
    return fail(Errc::nvml, "NVML library has no event API (nvmlEventSetWait_v2)");
  }
  auto events = std::make_unique<Events>();
  if (int rc = m_api->event_set_create(&events->set); rc != nvml::SUCCESS) {
    return std::unexpected(error("nvmlEventSetCreate", rc));
  }
  auto list = gpus();
  if (!list) {
    m_api->event_set_free(events->set);
    return std::unexpected(list.error());
  }
  for (const auto& gpu : *list) {
    auto dev = handle(gpu.uuid);
    if (!dev) {
      events->failures.push_back({gpu.uuid, dev.error().message});
      continue;
    }
    // Register only what the device supports; "All" differs between headers (docs/nvml.md §4.3).
    // When the GPU cannot say what it supports, try XIDs anyway (only a failed registration
    // leaves it out).
    unsigned long long supported = nvml::kEventXidCritical;
    if (m_api->supported_events && m_api->supported_events(*dev, &supported) != nvml::SUCCESS)
      supported = nvml::kEventXidCritical;
    unsigned long long wanted = nvml::kEventXidCritical & supported;
    if (!wanted) {
      events->failures.push_back({gpu.uuid, "the GPU reports no critical XID events"});
    } else if (int rc = m_api->register_events(*dev, wanted, events->set); rc != nvml::SUCCESS) {
      events->failures.push_back(
          {gpu.uuid, error("nvmlDeviceRegisterEvents " + gpu.uuid, rc).message});
    }
    events->uuids[*dev] = gpu.uuid;
  }
  m_events = std::move(events);
  return {};
}

std::vector<EventRegistrationFailure> NvmlInventory::event_registration_failures() {
  return m_events ? m_events->failures : std::vector<EventRegistrationFailure>{};
}

Result<std::optional<GpuEvent>> NvmlInventory::wait_event(std::chrono::milliseconds timeout) {
  if (auto st = ensure_events(); !st) return std::unexpected(st.error());
  nvmlEventData_t data{};
  int rc = m_api->event_wait(m_events->set, &data, static_cast<unsigned>(timeout.count()));
  if (rc == nvml::ERROR_TIMEOUT) return std::optional<GpuEvent>{};
  if (rc == nvml::ERROR_GPU_IS_LOST) return std::optional<GpuEvent>{GpuEvent{"", 79, true}};
  if (rc != nvml::SUCCESS) return std::unexpected(error("nvmlEventSetWait_v2", rc));
  if (!(data.eventType & nvml::kEventXidCritical)) return std::optional<GpuEvent>{};
  GpuEvent ev;
  ev.xid = data.eventData;
  if (auto it = m_events->uuids.find(data.device); it != m_events->uuids.end())
    ev.uuid = it->second;
  return std::optional<GpuEvent>{ev};
}

}  // namespace gpufence
