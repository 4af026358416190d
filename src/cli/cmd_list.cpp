#include <iostream>

#include "cli/commands.hpp"
#include "common/hostfs.hpp"
#include "gpu/listing.hpp"
#include "gpu/nvml_inventory.hpp"

namespace gpufence::cli {

std::vector<Command> add_list_command(CLI::App& app, Context& ctx) {
  auto json = std::make_shared<bool>(false);
  auto* list = app.add_subcommand("list",
                                  "List the node's GPUs (like nvidia-smi -L) with minor, bus id, "
                                  "NUMA node, memory and processes");
  list->add_flag("--json", *json, "Machine-readable output (schema gpufence.list/v1)");
  list->footer(
      "Example:\n  gpufence list\n  GPU 0: NVIDIA GeForce RTX 3080 (UUID: GPU-5a1c0b3e-...)\n      "
      "minor 0 (/dev/nvidia0)  bus 00000000:01:00.0  numa 0  memory 10240 MiB");
  return {{list, [&ctx, json] {
             auto inventory =
                 NvmlInventory::open(nvml_library_path(ctx.nvml_library), HostFs(ctx.host_root));
             if (!inventory) {
               std::cerr << "gpufence list: " << inventory.error().message << "\n";
               return 2;
             }
             auto listing = gather_listing(**inventory);
             if (!listing) {
               std::cerr << "gpufence list: " << listing.error().message << "\n";
               return 2;
             }
             if (*json)
               std::cout << render_listing_json(*listing).dump(2) << "\n";
             else
               std::cout << render_listing_text(*listing);
             return 0;
           }}};
}

}  // namespace gpufence::cli
