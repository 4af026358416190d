// `gpufence list`: the GPUs as `nvidia-smi -L` prints them, plus what isolation needs to know.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/gpu.hpp"

namespace gpufence {

struct GpuListing {
  std::string driver_version;
  std::vector<Gpu> gpus;
  std::map<std::string, std::vector<GpuProcess>> processes;  // by UUID
  std::map<std::string, std::string> process_errors;         // by UUID, when the query failed
};

Result<GpuListing> gather_listing(GpuInventory& inventory);
std::string render_listing_text(const GpuListing& listing);
// Stable schema "gpufence.list/v1"; documented in docs/list.md.
nlohmann::ordered_json render_listing_json(const GpuListing& listing);

}  // namespace gpufence
