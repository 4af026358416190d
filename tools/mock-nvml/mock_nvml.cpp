// A stand-in for the NVIDIA driver's libnvidia-ml.so.1: the same C ABI (src/gpu/nvml_abi.hpp,
// from docs/nvml.md), answered from a JSON description named by
// $MOCK_NVML_CONFIG. Events are injected at run time by appending JSON lines to an events file
// ("events_file" in the config, relative to the config's directory, or $MOCK_NVML_EVENTS):
//   {"gpu": 0, "xid": 48}        a critical XID on GPU 0 (index or UUID)
//   {"gpu": 1, "lost": true}     GPU 1 fell off the bus: its queries answer GPU_IS_LOST (15)
//   {"gpu": 1, "lost": false}    GPU 1 answers again
//   {"gpu": 1, "recovery_action": 2}  the driver's recovery action for GPU 1 becomes 2 (node
//                                reboot; nvmlDeviceGetFieldValues field 230), raising XID 154
//                                (GPU_RECOVERY_ACTION_CHANGED) as the driver does; a GPU whose
//                                config has no "recovery_action" answers the field NOT_SUPPORTED
//   {"hang": "nvmlDeviceGetUUID"}      from now on that function blocks when called (a driver
//                                      stuck in the kernel), without holding the mock's lock
//   {"release": "nvmlDeviceGetUUID"}   calls blocked there return (and new ones run) again
// The config's "hang": ["fn", ...] makes functions block from nvmlInit_v2 on, like its
// "fail": {"fn": code} makes them answer an error.
//
// Driver visibility (opt-in; off = every configured GPU is enumerated, as before). With
// "visibility": "driver" in the config or MOCK_NVML_VISIBILITY=driver, nvmlInit enumerates only
// the GPUs the real driver's NVML would see from where the caller runs (docs/mock-nvml.md):
//   - its /proc/driver/nvidia/gpus/<bus id> entry exists (directory from "procfs_gpus_dir" or
//     $MOCK_NVML_PROCFS_DIR; bus id in the driver's spelling, e.g. 0000:01:00.0), and
//   - /dev/nvidia<minor> opens O_RDWR, or fails with ENXIO (a fake node with no driver behind
//     it: the devices cgroup let it through); EPERM, ENOENT or any other error = absent.
//     The directory is "dev_dir" or $MOCK_NVML_DEV_DIR (default /dev).
// Visible GPUs are numbered 0..n-1 in config order; hidden ones are unknown to every call.
//
// Process accounting (opt-in): "processes_file" in the config or $MOCK_NVML_PROCESSES names a
// text file of lines "PID UUID USED_MIB [PIDNS]" (PIDNS: the writer's `readlink
// /proc/self/ns/pid`, e.g. pid:[4026531836]). The running-processes calls answer with the
// config's "processes" plus the file's lines for that GPU whose process still exists, its pid
// translated into the caller's pid namespace (through /proc/<pid>/ns/pid and the last NSpid of
// /proc/<pid>/status); lines whose process is gone or not visible from the caller are dropped.
//
// Everything NVIDIA's k8s-device-plugin v0.18 calls or looks up is answered
// (tools/mock-nvml/nvidia-device-plugin-v0.18.calls, docs/mock-nvml.md): compute capability,
// architecture and brand per GPU ("cuda_compute_capability": [major, minor], "architecture",
// "brand"; defaults derived from the name), and MIG answered as NVML does for a GPU without MIG
// ("mig_mode": "unsupported", the default, or "disabled" for a MIG-capable GPU with MIG off).
//
// Build variants drop symbols to exercise the loader's fallbacks (MOCK_NVML_LEGACY) and its
// missing-symbol error (MOCK_NVML_NO_UUID).
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu/nvml_abi.hpp"

#define MOCK_EXPORT extern "C" __attribute__((visibility("default")))

struct nvmlDevice_st {
  unsigned index = 0;         // as the caller enumerates it
  unsigned config_index = 0;  // position in the config (topology and events refer to it)
  std::string uuid, name, bus_id;
  unsigned minor = 0;
  unsigned long long memory_total = 0, memory_used = 0;
  int numa_node = -1;  // -1: NOT_SUPPORTED, as on ordinary PCIe systems
  unsigned pci_device_id = 0x220610DE;
  std::vector<std::pair<unsigned, unsigned long long>> processes;
  std::vector<std::string> nvlinks;  // remote bus id per link
  int cc_major = 8, cc_minor = 0;    // CUDA compute capability
  unsigned architecture = 7;         // nvmlDeviceArchitecture_t (NVML_DEVICE_ARCH_AMPERE)
  int brand = 14;                    // nvmlBrandType_t (NVML_BRAND_NVIDIA)
  bool mig_capable = false;          // "mig_mode": "disabled"; never enabled (docs/mock-nvml.md)
  bool lost = false;
  unsigned long long registered_events = 0;
  int recovery_action = -1;  // -1: the field is not supported (drivers before R565)
};

// MIG instance handles. The mock has no MIG devices, so it never hands one out: every handle a
// caller passes in is one NVML would reject as invalid.
struct nvmlGpuInstance_st;
struct nvmlComputeInstance_st;
// Output structs of the MIG queries. The mock only ever answers them with an error, so it never
// writes one and needs no layout (nvml.h: nvmlDeviceAttributes_t, nvmlGpuInstanceProfileInfo_t,
// nvmlGpuInstanceInfo_t, nvmlComputeInstanceProfileInfo_t, nvmlComputeInstanceInfo_t).
struct nvmlDeviceAttributes_st;
struct nvmlGpuInstanceProfileInfo_st;
struct nvmlGpuInstanceInfo_st;
struct nvmlComputeInstanceProfileInfo_st;
struct nvmlComputeInstanceInfo_st;
using nvmlGpuInstance_t = nvmlGpuInstance_st*;
using nvmlComputeInstance_t = nvmlComputeInstance_st*;

struct nvmlEventSet_st {
  std::deque<nvmlEventData_t> pending;
};

namespace {

using json = nlohmann::json;
using namespace gpufence;

struct State {
  std::mutex mu;
  int init_count = 0;
  std::string driver_version = "550.54.15";
  std::string nvml_version = "12.550.54.15";
  int cuda_driver_version = 12040;
  std::vector<std::unique_ptr<nvmlDevice_st>> devices;
  std::vector<std::tuple<unsigned, unsigned, int>> topology;
  int default_topology = nvml::TOPOLOGY_SYSTEM;
  json fail = json::object();
  std::set<std::string> hanging;  // functions that block when called
  std::string events_file;
  std::streamoff events_offset = 0;
  std::vector<nvmlEventSet_st*> sets;
  std::string processes_file;
};

State& state() {
  static State s;
  return s;
}

int topology_level(const std::string& name) {
  if (name == "INTERNAL") return nvml::TOPOLOGY_INTERNAL;
  if (name == "SINGLE") return nvml::TOPOLOGY_SINGLE;
  if (name == "MULTIPLE") return nvml::TOPOLOGY_MULTIPLE;
  if (name == "HOSTBRIDGE") return nvml::TOPOLOGY_HOSTBRIDGE;
  if (name == "NODE") return nvml::TOPOLOGY_NODE;
  return nvml::TOPOLOGY_SYSTEM;
}

std::string setting(const json& cfg, const char* key, const char* env, const char* fallback) {
  if (const char* v = std::getenv(env); v && *v) return v;
  return cfg.value(key, std::string(fallback));
}

// The driver's name for a GPU's procfs entry: lower case, 4-digit domain (docs/mock-nvml.md).
std::string procfs_entry_name(std::string bus_id) {
  for (auto& c : bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (bus_id.find(':') == 8 && bus_id.starts_with("0000")) bus_id = bus_id.substr(4);
  return bus_id;
}

// What the real NVML requires to enumerate a GPU: its procfs entry and an openable node.
bool visible_to_driver(const nvmlDevice_st& d, const std::string& procfs_dir,
                       const std::string& dev_dir) {
  struct stat st {};
  std::string entry = procfs_dir + "/" + procfs_entry_name(d.bus_id);
  if (::stat(entry.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  std::string node = dev_dir + "/nvidia" + std::to_string(d.minor);
  int fd = ::open(node.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  return errno == ENXIO;
}

// Compute capability by product name, first match wins (CUDA C Programming Guide, "Compute
// Capabilities"; docs/mock-nvml.md). Names that match nothing get 8.0.
struct NamedCapability {
  const char* needle;
  int major, minor;
};
constexpr NamedCapability kCapabilityByName[] = {
    {"GB200", 10, 0},  {"B200", 10, 0},  {"B100", 10, 0},      {"Blackwell", 12, 0},
    {"RTX 50", 12, 0}, {"GH200", 9, 0},  {"H200", 9, 0},       {"H100", 9, 0},
    {"H800", 9, 0},    {"Ada", 8, 9},    {"RTX 40", 8, 9},     {"L40", 8, 9},
    {"L4", 8, 9},      {"A100", 8, 0},   {"A800", 8, 0},       {"A30", 8, 0},
    {"RTX 30", 8, 6},  {"A10", 8, 6},    {"A40", 8, 6},        {"A16", 8, 6},
    {"A2", 8, 6},      {"RTX 20", 7, 5}, {"Quadro RTX", 7, 5}, {"T4", 7, 5},
    {"TITAN V", 7, 0}, {"V100", 7, 0},   {"P100", 6, 0},       {"P40", 6, 1},
    {"P4", 6, 1},      {"GTX 10", 6, 1},
};

std::pair<int, int> capability_from_name(const std::string& name) {
  for (const auto& c : kCapabilityByName) {
    if (name.find(c.needle) != std::string::npos) return {c.major, c.minor};
  }
  return {8, 0};
}

// NVML_DEVICE_ARCH_* for a compute capability: the architecture each CUDA major.minor belongs to.
unsigned architecture_from_capability(int major, int minor) {
  switch (major) {
    case 3:
      return 2;  // KEPLER
    case 5:
      return 3;  // MAXWELL
    case 6:
      return 4;  // PASCAL
    case 7:
      return minor >= 5 ? 6 : 5;  // TURING (7.5), VOLTA (7.0, 7.2)
    case 8:
      return minor == 9 ? 8 : 7;  // ADA (8.9), AMPERE (8.0, 8.6, 8.7)
    case 9:
      return 9;  // HOPPER
    case 10:
    case 11:
    case 12:
      return 10;  // BLACKWELL
    default:
      return 0xFFFFFFFFu;  // NVML_DEVICE_ARCH_UNKNOWN
  }
}

constexpr std::pair<const char*, unsigned> kArchitectures[] = {
    {"kepler", 2}, {"maxwell", 3}, {"pascal", 4}, {"volta", 5},      {"turing", 6},
    {"ampere", 7}, {"ada", 8},     {"hopper", 9}, {"blackwell", 10}, {"unknown", 0xFFFFFFFFu},
};

// nvmlBrandType_t values (nvml.h).
constexpr std::pair<const char*, int> kBrands[] = {
    {"unknown", 0},     {"quadro", 1},      {"tesla", 2},       {"nvs", 3},
    {"grid", 4},        {"geforce", 5},     {"titan", 6},       {"nvidia_vapps", 7},
    {"nvidia_vpc", 8},  {"nvidia_vcs", 9},  {"nvidia_vws", 10}, {"nvidia_cloud_gaming", 11},
    {"quadro_rtx", 12}, {"nvidia_rtx", 13}, {"nvidia", 14},     {"geforce_rtx", 15},
    {"titan_rtx", 16},
};

// The brand a product name suggests; data-centre parts report plain NVIDIA (docs/mock-nvml.md).
int brand_from_name(const std::string& name) {
  if (name.find("TITAN RTX") != std::string::npos) return 16;
  if (name.find("TITAN") != std::string::npos) return 6;
  if (name.find("GeForce") != std::string::npos) return 5;
  if (name.find("Quadro RTX") != std::string::npos) return 12;
  if (name.find("Quadro") != std::string::npos) return 1;
  if (name.find("NVIDIA RTX") != std::string::npos) return 13;
  return 14;
}

template <class T, std::size_t N>
T named_value(const std::pair<const char*, T> (&table)[N], const json& gpu, const char* field) {
  std::string value = gpu.at(field).get<std::string>();
  for (const auto& [name, v] : table) {
    if (strcasecmp(name, value.c_str()) == 0) return v;
  }
  throw std::runtime_error(std::string("gpus[].") + field + ": unknown value '" + value + "'");
}

// The per-GPU identity fields peer software reads: compute capability, architecture, brand, MIG.
void load_identity(const json& g, nvmlDevice_st& d) {
  std::tie(d.cc_major, d.cc_minor) = capability_from_name(d.name);
  if (g.contains("cuda_compute_capability")) {
    const auto& cc = g["cuda_compute_capability"];
    if (!cc.is_array() || cc.size() != 2 || !cc[0].is_number_integer() ||
        !cc[1].is_number_integer())
      throw std::runtime_error("gpus[].cuda_compute_capability: expected [major, minor]");
    d.cc_major = cc[0].get<int>();
    d.cc_minor = cc[1].get<int>();
  }
  d.architecture = g.contains("architecture")
                       ? named_value(kArchitectures, g, "architecture")
                       : architecture_from_capability(d.cc_major, d.cc_minor);
  d.brand = g.contains("brand") ? named_value(kBrands, g, "brand") : brand_from_name(d.name);
  std::string mig = g.value("mig_mode", std::string("unsupported"));
  if (mig != "unsupported" && mig != "disabled")
    throw std::runtime_error("gpus[].mig_mode: '" + mig +
                             "' is not unsupported or disabled (the mock has no MIG devices)");
  d.mig_capable = mig == "disabled";
}

// Loads the JSON description; any problem makes init fail with UNKNOWN and a line on stderr.
// The description's path: $MOCK_NVML_CONFIG, else mock-nvml.json beside this library (a
// process whose environment the test does not set, e.g. a pod of a real cluster, loads the mock
// from a driver directory that holds its description too); empty when neither is there.
std::string config_path() {
  if (const char* v = std::getenv("MOCK_NVML_CONFIG"); v && *v) return v;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&config_path), &info) == 0 || !info.dli_fname) return {};
  std::string lib = info.dli_fname;
  auto slash = lib.rfind('/');
  std::string beside =
      (slash == std::string::npos ? std::string(".") : lib.substr(0, slash)) + "/mock-nvml.json";
  struct stat st {};
  return ::stat(beside.c_str(), &st) == 0 ? beside : std::string();
}

int load_config(State& s) {
  const std::string config = config_path();
  const char* path = config.c_str();
  s.devices.clear();
  s.topology.clear();
  if (config.empty()) {
    std::fprintf(
        stderr,
        "mock-nvml: MOCK_NVML_CONFIG is not set (and no mock-nvml.json beside the library)\n");
    return nvml::ERROR_DRIVER_NOT_LOADED;
  }
  try {
    std::ifstream in(path);
    if (!in) {
      std::fprintf(stderr, "mock-nvml: cannot open %s\n", path);
      return nvml::ERROR_DRIVER_NOT_LOADED;
    }
    json cfg = json::parse(in);
    if (int err = cfg.value("init_error", 0); err != 0) return err;
    s.driver_version = cfg.value("driver_version", s.driver_version);
    s.nvml_version = cfg.value("nvml_version", s.nvml_version);
    s.cuda_driver_version = cfg.value("cuda_driver_version", s.cuda_driver_version);
    s.fail = cfg.value("fail", json::object());
    s.hanging.clear();
    for (const auto& fn : cfg.value("hang", json::array())) s.hanging.insert(fn.get<std::string>());
    s.default_topology = topology_level(cfg.value("default_topology", std::string("SYSTEM")));
    unsigned index = 0;
    for (const auto& g : cfg.value("gpus", json::array())) {
      auto d = std::make_unique<nvmlDevice_st>();
      d->config_index = index++;
      d->uuid = g.at("uuid").get<std::string>();
      d->name = g.value("name", std::string("NVIDIA Mock GPU"));
      d->minor = g.value("minor", d->config_index);
      d->bus_id = g.value("pci_bus_id", std::string("00000000:01:00.0"));
      d->memory_total = g.value("memory_total", 10737418240ULL);
      d->memory_used = g.value("memory_used", 0ULL);
      d->numa_node =
          g.contains("numa_node") && !g["numa_node"].is_null() ? g["numa_node"].get<int>() : -1;
      d->lost = g.value("lost", false);
      d->recovery_action = g.value("recovery_action", -1);
      load_identity(g, *d);
      for (const auto& p : g.value("processes", json::array())) {
        d->processes.emplace_back(p.at("pid").get<unsigned>(), p.value("used_memory", 0ULL));
      }
      for (const auto& link : g.value("nvlinks", json::array()))
        d->nvlinks.push_back(link.get<std::string>());
      s.devices.push_back(std::move(d));
    }
    std::string visibility = setting(cfg, "visibility", "MOCK_NVML_VISIBILITY", "all");
    if (visibility == "driver") {
      std::string procfs_dir =
          setting(cfg, "procfs_gpus_dir", "MOCK_NVML_PROCFS_DIR", "/proc/driver/nvidia/gpus");
      std::string dev_dir = setting(cfg, "dev_dir", "MOCK_NVML_DEV_DIR", "/dev");
      std::erase_if(s.devices,
                    [&](const auto& d) { return !visible_to_driver(*d, procfs_dir, dev_dir); });
    } else if (visibility != "all") {
      std::fprintf(stderr, "mock-nvml: bad config %s: visibility '%s' is not all or driver\n", path,
                   visibility.c_str());
      return nvml::ERROR_UNKNOWN;
    }
    for (unsigned i = 0; i < s.devices.size(); ++i) s.devices[i]->index = i;
    s.processes_file = setting(cfg, "processes_file", "MOCK_NVML_PROCESSES", "");
    for (const auto& t : cfg.value("topology", json::array())) {
      auto pair = t.at("gpus");
      s.topology.emplace_back(pair.at(0).get<unsigned>(), pair.at(1).get<unsigned>(),
                              topology_level(t.value("level", std::string("SYSTEM"))));
    }
    s.events_file = cfg.value("events_file", std::string());
    // A relative one is beside the config (a driver root mounted elsewhere in a pod still finds
    // the file the host appends to).
    if (!s.events_file.empty() && s.events_file[0] != '/') {
      std::string dir(path);
      dir = dir.find('/') == std::string::npos ? "." : dir.substr(0, dir.rfind('/'));
      s.events_file = dir + "/" + s.events_file;
    }
    if (s.events_file.empty()) {
      if (const char* ev = std::getenv("MOCK_NVML_EVENTS")) s.events_file = ev;
    }
    s.events_offset = 0;
    if (!s.events_file.empty()) {
      // Events written before init are history: NVML only records from registration on.
      std::ifstream ev(s.events_file, std::ios::ate);
      if (ev) s.events_offset = ev.tellg();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mock-nvml: bad config %s: %s\n", path, e.what());
    return nvml::ERROR_UNKNOWN;
  }
  return nvml::SUCCESS;
}

// An injected failure for `fn` from the config's "fail" map, or SUCCESS.
int injected(State& s, const char* fn) {
  return s.fail.value(fn, nvml::SUCCESS);
}

nvmlDevice_st* find_device(State& s, const json& ref) {
  for (auto& d : s.devices) {
    if (ref.is_number_unsigned() && d->config_index == ref.get<unsigned>()) return d.get();
    if (ref.is_string() && d->uuid == ref.get<std::string>()) return d.get();
  }
  return nullptr;
}

// Reads complete lines appended to the events file since the last call.
void poll_events(State& s) {
  if (s.events_file.empty()) return;
  std::ifstream in(s.events_file);
  if (!in) return;
  in.seekg(s.events_offset);
  std::string line;
  while (true) {
    std::streamoff start = in.tellg();
    if (!std::getline(in, line)) break;
    if (in.eof()) {  // a partial line: wait for the writer to finish it
      s.events_offset = start;
      return;
    }
    s.events_offset = in.tellg();
    try {
      json ev = json::parse(line);
      if (ev.contains("hang")) {
        s.hanging.insert(ev["hang"].get<std::string>());
        continue;
      }
      if (ev.contains("release")) {
        s.hanging.erase(ev["release"].get<std::string>());
        continue;
      }
      nvmlDevice_st* d = find_device(s, ev.at("gpu"));
      if (!d) continue;
      if (ev.contains("lost")) {
        d->lost = ev["lost"].get<bool>();
        continue;
      }
      if (ev.contains("recovery_action")) d->recovery_action = ev["recovery_action"].get<int>();
      unsigned long long xid = ev.contains("xid") ? ev["xid"].get<unsigned long long>()
                               : ev.contains("recovery_action") ? 154
                                                                : 0;
      if (xid && (d->registered_events & nvml::kEventXidCritical)) {
        nvmlEventData_t data{};
        data.device = d;
        data.eventType = nvml::kEventXidCritical;
        data.eventData = xid;
        data.gpuInstanceId = 0xFFFFFFFFu;
        data.computeInstanceId = 0xFFFFFFFFu;
        for (auto* set : s.sets) set->pending.push_back(data);
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "mock-nvml: ignoring bad event line: %s\n", line.c_str());
    }
  }
}

// Blocks while `fn` is set to hang, re-reading the events file for its release. The mock's lock
// is held only to look, so other functions keep answering, as with a real per-call hang.
void hang_point(const char* fn) {
  State& s = state();
  while (true) {
    {
      std::lock_guard lock(s.mu);
      poll_events(s);
      if (!s.hanging.contains(fn)) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool valid(State& s, nvmlDevice_t d) {
  for (auto& dev : s.devices) {
    if (dev.get() == d) return true;
  }
  return false;
}

int copy_string(const std::string& value, char* buf, unsigned length) {
  if (!buf) return nvml::ERROR_INVALID_ARGUMENT;
  if (value.size() + 1 > length) return nvml::ERROR_INSUFFICIENT_SIZE;
  std::memcpy(buf, value.c_str(), value.size() + 1);
  return nvml::SUCCESS;
}

// Common prologue of every per-device query: initialised, a known handle, not lost.
#define DEVICE_PROLOGUE(fn, dev)                                \
  hang_point(fn);                                               \
  State& s = state();                                           \
  std::lock_guard lock(s.mu);                                   \
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;      \
  if (!valid(s, dev)) return nvml::ERROR_INVALID_ARGUMENT;      \
  if (int rc = injected(s, fn); rc != nvml::SUCCESS) return rc; \
  poll_events(s);                                               \
  if (dev->lost) return nvml::ERROR_GPU_IS_LOST;

void fill_pci(const nvmlDevice_st& d, nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof *pci);
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  std::sscanf(d.bus_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function);
  pci->domain = domain;
  pci->bus = bus;
  pci->device = device;
  pci->pciDeviceId = d.pci_device_id;
  std::snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", domain, bus, device);
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain, bus, device);
}

std::string read_link(const std::string& path) {
  char buf[256];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The innermost pid of /proc/<pid> (the last field of its NSpid line), 0 if unreadable.
unsigned innermost_pid(const std::string& proc_pid_dir) {
  std::ifstream in(proc_pid_dir + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("NSpid:")) continue;
    auto last = line.find_last_of(" \t");
    return static_cast<unsigned>(std::strtoul(line.c_str() + last + 1, nullptr, 10));
  }
  return 0;
}

// `pid` as the caller sees it, for a process registered from pid namespace `pidns` (empty: the
// caller's own); 0 when that process is gone or not visible from here.
unsigned caller_pid(unsigned pid, const std::string& pidns) {
  if (pidns.empty() || pidns == read_link("/proc/self/ns/pid"))
    return ::access(("/proc/" + std::to_string(pid)).c_str(), F_OK) == 0 ? pid : 0;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc"), ::closedir);
  if (!dir) return 0;
  while (dirent* e = ::readdir(dir.get())) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::string p = std::string("/proc/") + e->d_name;
    if (read_link(p + "/ns/pid") == pidns && innermost_pid(p) == pid)
      return static_cast<unsigned>(std::strtoul(e->d_name, nullptr, 10));
  }
  return 0;
}

// The config's processes for `dev` plus the live ones registered in the processes file.
std::vector<std::pair<unsigned, unsigned long long>> processes_of(const State& s,
                                                                  const nvmlDevice_st& dev) {
  auto out = dev.processes;
  if (s.processes_file.empty()) return out;
  std::ifstream in(s.processes_file);
  std::string line;
  while (std::getline(in, line)) {
    char uuid[96] = {}, pidns[64] = {};
    unsigned pid = 0;
    unsigned long long mib = 0;
    if (std::sscanf(line.c_str(), "%u %95s %llu %63s", &pid, uuid, &mib, pidns) < 3) continue;
    if (dev.uuid != uuid) continue;
    if (unsigned here = caller_pid(pid, pidns)) out.emplace_back(here, mib << 20);
  }
  return out;
}

template <class Record>
int running_processes(nvmlDevice_t dev, unsigned* count, Record* infos, const char* fn) {
  DEVICE_PROLOGUE(fn, dev);
  if (!count) return nvml::ERROR_INVALID_ARGUMENT;
  auto processes = processes_of(s, *dev);
  unsigned needed = static_cast<unsigned>(processes.size());
  if (*count < needed) {
    *count = needed;
    return nvml::ERROR_INSUFFICIENT_SIZE;
  }
  if (needed && !infos) return nvml::ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < needed; ++i) {
    Record r{};
    r.pid = processes[i].first;
    r.usedGpuMemory = processes[i].second;
    if constexpr (sizeof(Record) == sizeof(nvmlProcessInfo_v2_t)) {
      r.gpuInstanceId = 0xFFFFFFFFu;
      r.computeInstanceId = 0xFFFFFFFFu;
    }
    infos[i] = r;
  }
  *count = needed;
  return nvml::SUCCESS;
}

}  // namespace

// One static string per nvmlReturn_t value of nvml.h (0-30, 999), so each pointer stays valid
// after nvmlShutdown as the driver's do; an unknown value reads "Unknown Error". The wording is
// the mock's own description of each code (docs/mock-nvml.md), not the driver's bytes.
MOCK_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 5:
      return "Already Initialized";
    case 6:
      return "Not Found";
    case 7:
      return "Insufficient Size";
    case 8:
      return "Insufficient External Power";
    case 9:
      return "Driver Not Loaded";
    case 10:
      return "Timeout";
    case 11:
      return "Interrupt Request Issue";
    case 12:
      return "NVML Shared Library Not Found";
    case 13:
      return "Function Not Found";
    case 14:
      return "Corrupted infoROM";
    case 15:
      return "GPU is lost";
    case 16:
      return "GPU requires reset";
    case 17:
      return "GPU access blocked by the operating system";
    case 18:
      return "Driver/library version mismatch";
    case 19:
      return "In use by another client";
    case 20:
      return "Insufficient Memory";
    case 21:
      return "No data";
    case 22:
      return "vGPU ECC not supported";
    case 23:
      return "Insufficient resources";
    case 24:
      return "Frequency not supported";
    case 25:
      return "Argument version mismatch";
    case 26:
      return "Deprecated";
    case 27:
      return "Not ready";
    case 28:
      return "GPU not found";
    case 29:
      return "Invalid state";
    case 30:
      return "Reset type not supported";
    default:
      return "Unknown Error";
  }
}

MOCK_EXPORT nvmlReturn_t nvmlInit_v2() {
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    if (s.init_count == 0) {
      if (int rc = load_config(s); rc != nvml::SUCCESS) return rc;
    }
  }
  hang_point("nvmlInit_v2");
  std::lock_guard lock(s.mu);
  ++s.init_count;
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlInit() {
  return nvmlInit_v2();
}
MOCK_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned) {
  return nvmlInit_v2();
}

MOCK_EXPORT nvmlReturn_t nvmlShutdown() {
  hang_point("nvmlShutdown");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count > 0) --s.init_count;  // extra shutdowns are not an error (docs/nvml.md §5)
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned length) {
  hang_point("nvmlSystemGetDriverVersion");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  return copy_string(s.driver_version, version, length);
}

MOCK_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned length) {
  State& s = state();
  std::lock_guard lock(s.mu);
  return copy_string(s.nvml_version, version, length);
}

MOCK_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* v) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!v) return nvml::ERROR_INVALID_ARGUMENT;
  *v = s.cuda_driver_version;
  return nvml::SUCCESS;
}
MOCK_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) {
  return nvmlSystemGetCudaDriverVersion(v);
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) {
  hang_point("nvmlDeviceGetCount_v2");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  if (!count) return nvml::ERROR_INVALID_ARGUMENT;
  if (int rc = injected(s, "nvmlDeviceGetCount_v2"); rc != nvml::SUCCESS) return rc;
  *count = static_cast<unsigned>(s.devices.size());
  return nvml::SUCCESS;
}
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned* count) {
  return nvmlDeviceGetCount_v2(count);
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
  hang_point("nvmlDeviceGetHandleByIndex_v2");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  if (!device || index >= s.devices.size()) return nvml::ERROR_INVALID_ARGUMENT;
  if (int rc = injected(s, "nvmlDeviceGetHandleByIndex_v2"); rc != nvml::SUCCESS) return rc;
  *device = s.devices[index].get();
  return nvml::SUCCESS;
}
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  hang_point("nvmlDeviceGetHandleByUUID");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  if (!uuid || !device) return nvml::ERROR_INVALID_ARGUMENT;
  poll_events(s);
  for (auto& d : s.devices) {
    if (d->uuid == uuid) {
      if (d->lost) return nvml::ERROR_GPU_IS_LOST;
      *device = d.get();
      return nvml::SUCCESS;
    }
  }
  return nvml::ERROR_NOT_FOUND;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id,
                                                          nvmlDevice_t* device) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  if (!bus_id || !device) return nvml::ERROR_INVALID_ARGUMENT;
  for (auto& d : s.devices) {
    if (strcasecmp(d->bus_id.c_str(), bus_id) == 0) {
      *device = d.get();
      return nvml::SUCCESS;
    }
  }
  return nvml::ERROR_NOT_FOUND;
}

#ifndef MOCK_NVML_NO_UUID
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char* uuid, unsigned length) {
  DEVICE_PROLOGUE("nvmlDeviceGetUUID", dev);
  return copy_string(dev->uuid, uuid, length);
}
#endif

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char* name, unsigned length) {
  DEVICE_PROLOGUE("nvmlDeviceGetName", dev);
  return copy_string(dev->name, name, length);
}

#ifndef MOCK_NVML_LEGACY
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned* index) {
  DEVICE_PROLOGUE("nvmlDeviceGetIndex", dev);
  if (!index) return nvml::ERROR_INVALID_ARGUMENT;
  *index = dev->index;
  return nvml::SUCCESS;
}
#endif

// Only field 230 (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) is known; every other field answers
// NOT_SUPPORTED in its own nvmlReturn, as the driver answers a field a GPU lacks.
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count,
                                                  nvmlFieldValue_t* values) {
  DEVICE_PROLOGUE("nvmlDeviceGetFieldValues", dev);
  if (count <= 0 || !values) return nvml::ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < count; ++i) {
    nvmlFieldValue_t& f = values[i];
    f.value = 0;
    if (f.fieldId == nvml::kFieldGpuRecoveryAction && dev->recovery_action >= 0) {
      f.valueType = nvml::kValueTypeUnsignedInt;
      f.nvmlReturn = nvml::SUCCESS;
      f.value = static_cast<unsigned>(dev->recovery_action);
    } else {
      f.nvmlReturn = nvml::ERROR_NOT_SUPPORTED;
    }
  }
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned* minor) {
  DEVICE_PROLOGUE("nvmlDeviceGetMinorNumber", dev);
  if (!minor) return nvml::ERROR_INVALID_ARGUMENT;
  *minor = dev->minor;
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t* pci) {
  DEVICE_PROLOGUE("nvmlDeviceGetPciInfo_v3", dev);
  if (!pci) return nvml::ERROR_INVALID_ARGUMENT;
  fill_pci(*dev, pci);
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* mem) {
  DEVICE_PROLOGUE("nvmlDeviceGetMemoryInfo", dev);
  if (!mem) return nvml::ERROR_INVALID_ARGUMENT;
  mem->total = dev->memory_total;
  mem->used = dev->memory_used;
  mem->free = dev->memory_total - dev->memory_used;
  return nvml::SUCCESS;
}

struct MockMemoryV2 {
  unsigned version;
  unsigned long long total, reserved, free, used;
};
static_assert(sizeof(MockMemoryV2) == 40);

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, MockMemoryV2* mem) {
  DEVICE_PROLOGUE("nvmlDeviceGetMemoryInfo_v2", dev);
  if (!mem) return nvml::ERROR_INVALID_ARGUMENT;
  if (mem->version != 0x02000028u) return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  mem->total = dev->memory_total;
  mem->reserved = 0;
  mem->used = dev->memory_used;
  mem->free = dev->memory_total - dev->memory_used;
  return nvml::SUCCESS;
}

#ifndef MOCK_NVML_LEGACY
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, unsigned* node) {
  DEVICE_PROLOGUE("nvmlDeviceGetNumaNodeId", dev);
  if (!node) return nvml::ERROR_INVALID_ARGUMENT;
  if (dev->numa_node < 0) return nvml::ERROR_NOT_SUPPORTED;
  *node = static_cast<unsigned>(dev->numa_node);
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned* count,
                                                                 nvmlProcessInfo_v2_t* infos) {
  return running_processes(dev, count, infos, "nvmlDeviceGetComputeRunningProcesses_v3");
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned* count,
                                                                 nvmlProcessInfo_v2_t* infos) {
  return running_processes(dev, count, infos, "nvmlDeviceGetComputeRunningProcesses_v2");
}
#endif

// The plain name is the legacy v1 entry point with 16-byte records, as in the real library.
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned* count,
                                                              nvmlProcessInfo_v1_t* infos) {
  return running_processes(dev, count, infos, "nvmlDeviceGetComputeRunningProcesses");
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b,
                                                             nvmlGpuTopologyLevel_t* level) {
  DEVICE_PROLOGUE("nvmlDeviceGetTopologyCommonAncestor", a);
  if (!valid(s, b) || !level) return nvml::ERROR_INVALID_ARGUMENT;
  *level = s.default_topology;
  for (auto [x, y, l] : s.topology) {
    if ((x == a->config_index && y == b->config_index) ||
        (x == b->config_index && y == a->config_index))
      *level = l;
  }
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned link,
                                                  nvmlEnableState_t* active) {
  DEVICE_PROLOGUE("nvmlDeviceGetNvLinkState", dev);
  if (!active) return nvml::ERROR_INVALID_ARGUMENT;
  // A link number the header allows but the GPU lacks is NOT_SUPPORTED: go-gpuallocator walks
  // links 0..NVML_NVLINK_MAX_LINKS-1 and gives up on any other error (docs/mock-nvml.md).
  if (link >= nvml::kMaxNvLinks) return nvml::ERROR_INVALID_ARGUMENT;
  if (link >= dev->nvlinks.size()) return nvml::ERROR_NOT_SUPPORTED;
  *active = dev->nvlinks[link].empty() ? 0 : nvml::FEATURE_ENABLED;
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned link,
                                                             nvmlPciInfo_t* pci) {
  DEVICE_PROLOGUE("nvmlDeviceGetNvLinkRemotePciInfo_v2", dev);
  if (!pci || link >= nvml::kMaxNvLinks) return nvml::ERROR_INVALID_ARGUMENT;
  if (link >= dev->nvlinks.size()) return nvml::ERROR_NOT_SUPPORTED;
  nvmlDevice_st remote;
  remote.bus_id = dev->nvlinks[link];
  fill_pci(remote, pci);
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  hang_point("nvmlEventSetCreate");
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  if (!set) return nvml::ERROR_INVALID_ARGUMENT;
  *set = new nvmlEventSet_st;
  s.sets.push_back(*set);
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev,
                                                          unsigned long long* types) {
  DEVICE_PROLOGUE("nvmlDeviceGetSupportedEventTypes", dev);
  if (!types) return nvml::ERROR_INVALID_ARGUMENT;
  *types = nvml::kEventXidCritical | nvml::kEventSingleBitEcc | nvml::kEventDoubleBitEcc;
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types,
                                                  nvmlEventSet_t) {
  DEVICE_PROLOGUE("nvmlDeviceRegisterEvents", dev);
  dev->registered_events |= types;
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data,
                                             unsigned timeout_ms) {
  hang_point("nvmlEventSetWait_v2");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    {
      State& s = state();
      std::lock_guard lock(s.mu);
      if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
      if (!set || !data) return nvml::ERROR_INVALID_ARGUMENT;
      if (int rc = injected(s, "nvmlEventSetWait_v2"); rc != nvml::SUCCESS) return rc;
      poll_events(s);
      for (auto& d : s.devices) {
        if (d->lost) return nvml::ERROR_GPU_IS_LOST;
      }
      if (!set->pending.empty()) {
        *data = set->pending.front();
        set->pending.pop_front();
        return nvml::SUCCESS;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return nvml::ERROR_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

MOCK_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  hang_point("nvmlEventSetFree");
  State& s = state();
  std::lock_guard lock(s.mu);
  std::erase(s.sets, set);
  delete set;
  return nvml::SUCCESS;
}

// ---- Identity queries k8s-device-plugin v0.18 makes of every GPU (docs/mock-nvml.md) ----

// BuildDevice fails the whole plugin when this is missing or fails (internal/rm/devices.go).
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int* major,
                                                            int* minor) {
  DEVICE_PROLOGUE("nvmlDeviceGetCudaComputeCapability", dev);
  if (!major || !minor) return nvml::ERROR_INVALID_ARGUMENT;
  *major = dev->cc_major;
  *minor = dev->cc_minor;
  return nvml::SUCCESS;
}

// nvmlDeviceArchitecture_t is a typedef of unsigned int.
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned* arch) {
  DEVICE_PROLOGUE("nvmlDeviceGetArchitecture", dev);
  if (!arch) return nvml::ERROR_INVALID_ARGUMENT;
  *arch = dev->architecture;
  return nvml::SUCCESS;
}

// nvmlBrandType_t is a C enum (4 bytes).
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t dev, int* type) {
  DEVICE_PROLOGUE("nvmlDeviceGetBrand", dev);
  if (!type) return nvml::ERROR_INVALID_ARGUMENT;
  *type = dev->brand;
  return nvml::SUCCESS;
}

// ---- MIG, answered as NVML does for a GPU with no MIG devices (docs/mock-nvml.md) ----
// Every handle the mock gives out is a full GPU: none is a MIG device handle.

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned* current,
                                              unsigned* pending) {
  DEVICE_PROLOGUE("nvmlDeviceGetMigMode", dev);
  if (!current || !pending) return nvml::ERROR_INVALID_ARGUMENT;
  if (!dev->mig_capable) return nvml::ERROR_NOT_SUPPORTED;
  *current = 0;  // NVML_DEVICE_MIG_DISABLE
  *pending = 0;
  return nvml::SUCCESS;
}

// "Returns zero if MIG is not supported or enabled" (nvml.h).
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned* count) {
  DEVICE_PROLOGUE("nvmlDeviceGetMaxMigDeviceCount", dev);
  if (!count) return nvml::ERROR_INVALID_ARGUMENT;
  *count = 0;
  return nvml::SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned,
                                                             nvmlDevice_t* mig) {
  DEVICE_PROLOGUE("nvmlDeviceGetMigDeviceHandleByIndex", dev);
  if (!mig) return nvml::ERROR_INVALID_ARGUMENT;
  return dev->mig_capable ? nvml::ERROR_NOT_FOUND : nvml::ERROR_NOT_SUPPORTED;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned* is_mig) {
  DEVICE_PROLOGUE("nvmlDeviceIsMigDeviceHandle", dev);
  if (!is_mig) return nvml::ERROR_INVALID_ARGUMENT;
  *is_mig = 0;
  return nvml::SUCCESS;
}

// A full-GPU handle is not a valid migDevice argument.
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                                      nvmlDevice_t*) {
  DEVICE_PROLOGUE("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig);
  return nvml::ERROR_INVALID_ARGUMENT;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned* id) {
  DEVICE_PROLOGUE("nvmlDeviceGetGpuInstanceId", dev);
  if (!id) return nvml::ERROR_INVALID_ARGUMENT;
  return nvml::ERROR_NOT_SUPPORTED;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned* id) {
  DEVICE_PROLOGUE("nvmlDeviceGetComputeInstanceId", dev);
  if (!id) return nvml::ERROR_INVALID_ARGUMENT;
  return nvml::ERROR_NOT_SUPPORTED;
}

// "This API currently only supports MIG device handles" (nvml.h).
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t dev,
                                                    nvmlDeviceAttributes_st* attributes) {
  DEVICE_PROLOGUE("nvmlDeviceGetAttributes_v2", dev);
  if (!attributes) return nvml::ERROR_INVALID_ARGUMENT;
  return nvml::ERROR_NOT_SUPPORTED;
}

// NOT_SUPPORTED "if device doesn't have MIG mode enabled" (nvml.h).
MOCK_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t dev, unsigned,
                                                             nvmlGpuInstanceProfileInfo_st* info) {
  DEVICE_PROLOGUE("nvmlDeviceGetGpuInstanceProfileInfo", dev);
  if (!info) return nvml::ERROR_INVALID_ARGUMENT;
  return nvml::ERROR_NOT_SUPPORTED;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t dev, unsigned,
                                                      nvmlGpuInstance_t* instance) {
  DEVICE_PROLOGUE("nvmlDeviceGetGpuInstanceById", dev);
  if (!instance) return nvml::ERROR_INVALID_ARGUMENT;
  return nvml::ERROR_NOT_SUPPORTED;
}

namespace {
// The instance queries: with no instance ever handed out, every instance handle is invalid.
nvmlReturn_t no_such_instance(const char* fn) {
  hang_point(fn);
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.init_count == 0) return nvml::ERROR_UNINITIALIZED;
  if (int rc = injected(s, fn); rc != nvml::SUCCESS) return rc;
  return nvml::ERROR_INVALID_ARGUMENT;
}
}  // namespace

MOCK_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t, nvmlGpuInstanceInfo_st*) {
  return no_such_instance("nvmlGpuInstanceGetInfo");
}

MOCK_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t, unsigned,
                                                               nvmlComputeInstance_t*) {
  return no_such_instance("nvmlGpuInstanceGetComputeInstanceById");
}

MOCK_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t, unsigned, unsigned, nvmlComputeInstanceProfileInfo_st*) {
  return no_such_instance("nvmlGpuInstanceGetComputeInstanceProfileInfo");
}

MOCK_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t,
                                                       nvmlComputeInstanceInfo_st*) {
  return no_such_instance("nvmlComputeInstanceGetInfo_v2");
}
