// gpufence: the node-side command line (list, and the commands later issues add).
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/hostfs.hpp"
#include "common/log.hpp"
#include "gpu/listing.hpp"
#include "gpu/nvml_inventory.hpp"

namespace {

using namespace gpufence;

// What every subcommand shares; one per invocation, no globals.
struct Context {
  std::string host_root = "/";
  std::string nvml_library;
  std::string log_file;
  std::string log_level = "warn";
  Logger log{LogLevel::warn};
};

Result<std::unique_ptr<NvmlInventory>> open_inventory(const Context& ctx) {
  return NvmlInventory::open(nvml_library_path(ctx.nvml_library), HostFs(ctx.host_root));
}

int run_list(Context& ctx, bool as_json) {
  auto inventory = open_inventory(ctx);
  if (!inventory) {
    std::cerr << "gpufence list: " << inventory.error().message << "\n";
    return 2;
  }
  auto listing = gather_listing(**inventory);
  if (!listing) {
    std::cerr << "gpufence list: " << listing.error().message << "\n";
    return 2;
  }
  if (as_json) std::cout << render_listing_json(*listing).dump(2) << "\n";
  else std::cout << render_listing_text(*listing);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  Context ctx;
  CLI::App app{"gpufence: exclusive, provable GPU allocation on Kubernetes nodes"};
  app.require_subcommand(1);
  app.add_option("--host-root", ctx.host_root, "Read the host's /proc, /sys, /dev, /etc under this root")
      ->capture_default_str();
  app.add_option("--nvml-library", ctx.nvml_library,
                 "NVML library to dlopen (default: $GPUFENCE_NVML_LIBRARY or libnvidia-ml.so.1)");
  app.add_option("--log-file", ctx.log_file, "Append logs to this file instead of stderr");
  app.add_option("--log-level", ctx.log_level, "debug, info, warn, error or off")->capture_default_str();

  bool list_json = false;
  auto* list = app.add_subcommand("list", "List the node's GPUs (like nvidia-smi -L) with minor, bus id, NUMA node, memory and processes");
  list->add_flag("--json", list_json, "Machine-readable output (schema gpufence.list/v1)");
  list->footer("Example:\n  gpufence list\n  GPU 0: NVIDIA GeForce RTX 3080 (UUID: GPU-5a1c0b3e-...)\n      minor 0 (/dev/nvidia0)  bus 00000000:01:00.0  numa 0  memory 10240 MiB");

  CLI11_PARSE(app, argc, argv);

  auto level = parse_log_level(ctx.log_level);
  if (!level) {
    std::cerr << "gpufence: " << level.error().message << "\n";
    return 2;
  }
  ctx.log.set_level(*level);
  if (!ctx.log_file.empty()) {
    if (auto st = ctx.log.open_file(ctx.log_file); !st) {
      std::cerr << "gpufence: " << st.error().message << "\n";
      return 2;
    }
  }
  if (list->parsed()) return run_list(ctx, list_json);
  return 2;
} catch (const std::exception& e) {
  std::cerr << "gpufence: internal error: " << e.what() << "\n";
  return 2;
}
