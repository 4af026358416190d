#include "gpu/driver_procfs.hpp"

#include "common/strings.hpp"

namespace gpufence {

Result<Gpu> parse_driver_gpu_information(std::string_view text) {
  Gpu gpu;
  bool has_uuid = false, has_minor = false;
  for (std::string_view line : split(text, '\n')) {
    auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = trim(line.substr(0, colon));
    std::string_view value = trim(line.substr(colon + 1));
    if (key == "Model") {
      gpu.name = std::string(value);
    } else if (key == "GPU UUID") {
      if (!value.starts_with("GPU-"))
        return fail(Errc::parse, "GPU UUID '", value, "' does not start with GPU-");
      gpu.uuid = std::string(value);
      has_uuid = true;
    } else if (key == "Bus Location") {
      // The driver writes "0000:01:00.0"; NVML's form is "00000000:01:00.0".
      std::string bus = to_upper_hex_bus(value);
      gpu.pci_bus_id = bus;
    } else if (key == "Device Minor") {
      auto minor = parse_number<unsigned>(value);
      if (!minor) return fail(Errc::parse, "Device Minor '", value, "' is not a number");
      gpu.minor = *minor;
      has_minor = true;
    }
  }
  if (!has_uuid || !has_minor) return fail(Errc::parse, "missing 'GPU UUID' or 'Device Minor'");
  return gpu;
}

std::string driver_gpu_entry_name(std::string_view pci_bus_id) {
  std::string id = to_lower(pci_bus_id);
  auto colon = id.find(':');
  if (colon == 8 && id.starts_with("0000")) id = id.substr(4);
  return id;
}

Result<std::vector<Gpu>> read_driver_gpus(const HostFs& host) {
  auto entries = host.list(kDriverGpusDir);
  if (!entries) return std::unexpected(entries.error());
  std::vector<Gpu> gpus;
  for (const auto& entry : *entries) {  // sorted: PCI bus order
    std::string path = cat(kDriverGpusDir, "/", entry, "/information");
    auto text = host.read(path);
    if (!text) return std::unexpected(text.error());
    auto gpu = parse_driver_gpu_information(*text);
    if (!gpu) return std::unexpected(gpu.error().wrap(host.resolve(path).native()));
    gpu->index = static_cast<unsigned>(gpus.size());
    gpus.push_back(std::move(*gpu));
  }
  return gpus;
}

}  // namespace gpufence
