#include <iostream>

#include "cdi/generate.hpp"
#include "cdi/spec.hpp"
#include "cli/commands.hpp"
#include "common/file.hpp"
#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "gpu/nvml_inventory.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence::cli {
namespace {

// What a valid spec does that gpufence-runtime treats specially (docs/cdi.md).
std::vector<std::string> cdi_validate_notes(const CdiSpec& spec) {
  std::vector<std::string> notes;
  auto edits = [&](const CdiContainerEdits& e, const std::string& where) {
    if (e.intel_rdt) notes.push_back(where + "intelRdt: gpufence-runtime refuses to apply it");
    if (!e.net_devices.empty())
      notes.push_back(where + "netDevices: gpufence-runtime refuses to apply it");
    for (const auto& h : e.hooks) {
      if (h.env.empty()) {
        notes.push_back(where + "hook " + h.path +
                        " has no env: gpufence-runtime gives it PATH only, other runtimes run it "
                        "with the container's environment");
      }
      if (!h.timeout) notes.push_back(where + "hook " + h.path + " has no timeout");
    }
  };
  edits(spec.edits, "");
  for (const auto& d : spec.devices) edits(d.edits, "device " + d.name + ": ");
  return notes;
}

}  // namespace

std::vector<Command> add_cdi_commands(CLI::App& app, Context& ctx) {
  auto* cdi = app.add_subcommand("cdi", "Generate and validate CDI specs for the node's GPUs");
  cdi->require_subcommand(1);

  struct GenerateArgs {
    std::string driver_root = "/", output, format, hook_path = std::string(kRuntimeBinaryPath),
                kind = std::string(kNvidiaCdiKind);
  };
  auto gen = std::make_shared<GenerateArgs>();
  auto* g =
      cdi->add_subcommand("generate", "Write a CDI spec for the host's GPUs and driver files");
  g->add_option("--driver-root", gen->driver_root,
                "Where the driver is installed (GPU Operator: /run/nvidia/driver)")
      ->capture_default_str();
  g->add_option("--output", gen->output,
                "Write here (atomically) instead of stdout, e.g. /etc/cdi/nvidia.yaml");
  g->add_option("--format", gen->format,
                "yaml or json (default: json when --output ends in .json, else yaml; the runtime "
                "reads JSON several times faster)");
  g->add_option("--hook-path", gen->hook_path,
                "gpufence-runtime's path on the node, for the ldcache hook")
      ->capture_default_str();
  g->add_option("--kind", gen->kind,
                cat("The spec's kind: ", kNvidiaCdiKind, " (as nvidia-ctk writes it) or ", kCdiKind,
                    " (gpufence-device-plugin's own, which it also writes itself)"))
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<std::string>(kGpuCdiKinds.begin(), kGpuCdiKinds.end())));
  g->footer(
      "Example:\n  gpufence cdi generate --output /etc/cdi/nvidia.yaml\nDevices: "
      "<kind>=<index>, <kind>=<UUID>, <kind>=all.\nOne directory must not hold two specs of "
      "one kind that define the same device (the CDI cache drops it): not beside NVIDIA's "
      "toolkit's spec in /var/run/cdi.");

  auto files = std::make_shared<std::vector<std::string>>();
  auto* v = cdi->add_subcommand("validate", "Check CDI spec files against the CDI spec's rules");
  v->add_option("files", *files, "Spec files (YAML or JSON)")->required();
  v->footer(
      "Example:\n  gpufence cdi validate /etc/cdi/nvidia.yaml\nExit: 0 all valid, 1 any invalid.");

  Runner run_generate = [gen, &ctx] {
    if (gen->format.empty()) gen->format = gen->output.ends_with(".json") ? "json" : "yaml";
    if (gen->format != "yaml" && gen->format != "json") {
      std::cerr << "gpufence cdi generate: --format must be yaml or json\n";
      return 2;
    }
    if (!gen->hook_path.starts_with("/")) {
      std::cerr << "gpufence cdi generate: --hook-path must be absolute (runc runs hooks by "
                   "absolute path)\n";
      return 2;
    }
    HostFs host(ctx.host_root);
    auto inventory = NvmlInventory::open(nvml_library_path(ctx.nvml_library), host);
    if (!inventory) {
      std::cerr << "gpufence cdi generate: " << inventory.error().message << "\n";
      return 2;
    }
    auto gpus = (*inventory)->gpus();
    if (!gpus) {
      std::cerr << "gpufence cdi generate: " << gpus.error().message << "\n";
      return 2;
    }
    CdiGenerateOptions opt;
    opt.driver_root = gen->driver_root;
    opt.hook_path = gen->hook_path;
    opt.kind = gen->kind;
    auto result = generate_cdi_spec(host, *gpus, (*inventory)->driver_version(), opt);
    if (!result) {
      std::cerr << "gpufence cdi generate: " << result.error().message << "\n";
      return 2;
    }
    for (const auto& w : result->warnings)
      std::cerr << "gpufence cdi generate: warning: " << w << "\n";
    std::string text = gen->format == "json" ? cdi_spec_to_json(result->spec).dump(2) + "\n"
                                             : cdi_spec_to_yaml(result->spec);
    if (gen->output.empty()) {
      std::cout << text;
      return 0;
    }
    if (auto st = write_file_atomic(gen->output, text); !st) {
      std::cerr << "gpufence cdi generate: " << st.error().message << "\n";
      return 2;
    }
    std::cerr << "wrote " << gen->output << " (cdiVersion " << result->spec.cdi_version << ", "
              << result->spec.devices.size() << " devices)\n";
    return 0;
  };

  Runner run_validate = [files] {
    int rc = 0;
    for (const auto& f : *files) {
      auto text = read_file(f);
      if (!text) {
        std::cerr << f << ": " << text.error().message << "\n";
        rc = 1;
        continue;
      }
      auto spec = parse_cdi_spec(*text, f);
      if (!spec) {
        std::cout << "invalid: " << spec.error().message << "\n";
        rc = 1;
      } else {
        std::cout << "valid: " << f << " (cdiVersion " << spec->cdi_version << ", kind "
                  << spec->kind << ", " << spec->devices.size() << " devices)\n";
        for (const auto& note : cdi_validate_notes(*spec)) std::cout << "  note: " << note << "\n";
      }
    }
    return rc;
  };
  return {{g, run_generate}, {v, run_validate}};
}

}  // namespace gpufence::cli
