#include "gpu/listing.hpp"

namespace gpufence {
namespace {

std::string mib(std::uint64_t bytes) {
  return std::to_string(bytes / (1024 * 1024)) + " MiB";
}

}  // namespace

Result<GpuListing> gather_listing(GpuInventory& inventory) {
  GpuListing out;
  auto gpus = inventory.gpus();
  if (!gpus) return std::unexpected(gpus.error());
  out.gpus = std::move(*gpus);
  for (const auto& gpu : out.gpus) {
    if (out.driver_version.empty()) out.driver_version = gpu.driver_version;
    // One GPU's failing process query must not hide the others.
    if (auto procs = inventory.processes(gpu.uuid))
      out.processes[gpu.uuid] = std::move(*procs);
    else
      out.process_errors[gpu.uuid] = procs.error().message;
  }
  return out;
}

std::string render_listing_text(const GpuListing& listing) {
  std::string out;
  if (listing.gpus.empty()) return "No GPUs found.\n";
  for (const auto& gpu : listing.gpus) {
    out += cat("GPU ", gpu.index, ": ", gpu.name, " (UUID: ", gpu.uuid, ")\n");
    out += cat("    minor ", gpu.minor, " (", gpu.device_path(), ")  bus ", gpu.pci_bus_id,
               "  numa ", gpu.numa_node ? std::to_string(*gpu.numa_node) : std::string("-"),
               "  memory ", mib(gpu.memory_total), "\n");
    if (auto err = listing.process_errors.find(gpu.uuid); err != listing.process_errors.end()) {
      out += cat("    processes: unknown (", err->second, ")\n");
      continue;
    }
    auto it = listing.processes.find(gpu.uuid);
    if (it == listing.processes.end() || it->second.empty()) {
      out += "    processes: none\n";
      continue;
    }
    for (const auto& p : it->second) {
      out += cat("    process ", p.pid, "  ",
                 p.used_memory ? mib(*p.used_memory) : std::string("n/a"), "\n");
    }
  }
  return out;
}

nlohmann::ordered_json render_listing_json(const GpuListing& listing) {
  nlohmann::ordered_json doc;
  doc["schema"] = "gpufence.list/v1";
  doc["driver_version"] = listing.driver_version;
  doc["gpus"] = nlohmann::ordered_json::array();
  for (const auto& gpu : listing.gpus) {
    nlohmann::ordered_json g;
    g["index"] = gpu.index;
    g["uuid"] = gpu.uuid;
    g["name"] = gpu.name;
    g["minor"] = gpu.minor;
    g["device_path"] = gpu.device_path();
    g["pci_bus_id"] = gpu.pci_bus_id;
    g["numa_node"] =
        gpu.numa_node ? nlohmann::ordered_json(*gpu.numa_node) : nlohmann::ordered_json();
    g["memory_total_bytes"] = gpu.memory_total;
    auto procs = nlohmann::ordered_json::array();
    if (auto it = listing.processes.find(gpu.uuid); it != listing.processes.end()) {
      for (const auto& p : it->second) {
        nlohmann::ordered_json rec;
        rec["pid"] = p.pid;
        rec["used_memory_bytes"] =
            p.used_memory ? nlohmann::ordered_json(*p.used_memory) : nlohmann::ordered_json();
        procs.push_back(std::move(rec));
      }
    }
    g["processes"] = std::move(procs);
    if (auto err = listing.process_errors.find(gpu.uuid); err != listing.process_errors.end()) {
      g["processes_error"] = err->second;
    }
    doc["gpus"].push_back(std::move(g));
  }
  return doc;
}

}  // namespace gpufence
