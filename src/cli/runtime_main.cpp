// gpufence-runtime: the OCI runtime a containerd runtime handler's BinaryName points at. It takes
// runc's command line; on create/run it narrows the bundle's spec to the allocated GPUs, then
// execs the low-level runtime with the original arguments. It never throws past main and fails
// closed: if it cannot prove what a container may have, the container does not start.
#include <unistd.h>

#include <cstring>
#include <iostream>

#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "gpu/nvml_inventory.hpp"
#include "runtime/hooks.hpp"
#include "runtime/shim.hpp"

namespace {

using namespace gpufence;

constexpr const char* kUsage =
    "usage: gpufence-runtime [runc global flags] <command> [flags] <container-id>\n"
    "\n"
    "An OCI runtime shim with runc's command line. On 'create' and 'run' it rewrites\n"
    "<bundle>/config.json so the container gets exactly the GPUs the kubelet allocated to it\n"
    "(CDI annotations, then /var/run/nvidia-container-devices mount markers, then\n"
    "NVIDIA_VISIBLE_DEVICES for privileged containers), even when privileged; then it execs\n"
    "the low-level runtime (runc) with the same arguments. Every other command, and --help or\n"
    "--version, goes to runc untouched.\n"
    "\n"
    "  gpufence-runtime hook driver-procfs --dir D --keep ENTRY...   (OCI createContainer hook)\n"
    "  gpufence-runtime hook update-ldcache --folder DIR...          (OCI createContainer hook)\n"
    "\n"
    "Configuration: /etc/gpufence/runtime.toml, or the file named by $GPUFENCE_RUNTIME_CONFIG\n"
    "(every key documented in deploy/runtime.toml). NVML: $GPUFENCE_NVML_LIBRARY overrides\n"
    "libnvidia-ml.so.1 when [devices] nvml_library is unset.\n"
    "\n"
    "Example containerd handler (config version 2):\n"
    "  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
    "    runtime_type = \"io.containerd.runc.v2\"\n"
    "    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
    "      BinaryName = \"/usr/local/bin/gpufence-runtime\"\n";

[[noreturn]] void exec_runtime(const std::string& path, int argc, char** argv) {
  std::vector<char*> args;
  args.push_back(const_cast<char*>(path.c_str()));
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  std::cerr << "gpufence-runtime: exec " << path << ": " << std::strerror(errno) << "\n";
  std::_Exit(127);
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--gpufence-help") {
    std::cout << kUsage;
    return 0;
  }
  // Our own OCI hooks, added to specs by the create path below.
  if (!args.empty() && args[0] == "hook")
    return run_hook(std::vector<std::string>(args.begin() + 1, args.end()));
  auto inv = parse_runc_args(args);
  if (!inv) {
    std::cerr << "gpufence-runtime: " << inv.error().message << "\n";
    return 1;
  }

  auto config = load_runtime_config();
  if (!inv->edits_spec()) {
    // No isolation at stake: state/start/kill/delete must keep working even with a broken
    // config, or containers could never be cleaned up.
    std::string low_level = config ? config->low_level_runtime : RuntimeConfig{}.low_level_runtime;
    if (!config)
      std::cerr << "gpufence-runtime: warning: " << config.error().message << "; using "
                << low_level << "\n";
    auto path = resolve_low_level_runtime(low_level);
    if (!path) {
      std::cerr << "gpufence-runtime: " << path.error().message << "\n";
      return 1;
    }
    exec_runtime(*path, argc, argv);
  }

  if (!config) {
    std::cerr << "gpufence-runtime: refusing to create container " << inv->container_id << ": "
              << config.error().message << "\n";
    return 1;
  }
  auto level = parse_log_level(config->log_level);
  Logger log(level ? *level : LogLevel::info);
  if (!config->log_file.empty()) {
    if (auto st = log.open_file(config->log_file); !st) {
      log.set_level(LogLevel::warn);
      log.warn("runtime.log_file_unavailable", {{"error", st.error().message}});
    }
  }
  auto runtime_path = resolve_low_level_runtime(config->low_level_runtime);
  if (!runtime_path) {
    std::cerr << "gpufence-runtime: " << runtime_path.error().message << "\n";
    log.error("runtime.refused",
              {{"container", inv->container_id}, {"error", runtime_path.error().message}});
    return 1;
  }

  ShimContext ctx{*config, log, [&]() -> Result<std::unique_ptr<GpuInventory>> {
                    auto nvml =
                        NvmlInventory::open(nvml_library_path(config->nvml_library), HostFs("/"));
                    if (!nvml) return std::unexpected(nvml.error());
                    return std::unique_ptr<GpuInventory>(std::move(*nvml));
                  }};
  auto decision = prepare_bundle(*inv, ctx);
  if (!decision) {
    // One line: containerd shows it to the user as the reason the container failed.
    std::cerr << "gpufence-runtime: refusing to create container " << inv->container_id << ": "
              << decision.error().message << "\n";
    log.error("runtime.refused", {{"container", inv->container_id},
                                  {"bundle", inv->bundle},
                                  {"error", decision.error().message}});
    return 1;
  }
  std::vector<std::string> denied;
  for (unsigned m : decision->denied_minors) denied.push_back("/dev/nvidia" + std::to_string(m));
  log.info("runtime.decision", {{"container", decision->container_id},
                                {"command", inv->subcommand},
                                {"channel", std::string(channel_name(decision->channel))},
                                {"privileged", decision->privileged ? "true" : "false"},
                                {"passthrough", decision->passthrough ? "true" : "false"},
                                {"granted", join(decision->granted, ",")},
                                {"denied", join(denied, ",")},
                                {"spec_changed", decision->spec_changed ? "true" : "false"},
                                {"gpus_from", decision->inventory_source},
                                {"cdi", join(decision->cdi_devices, ",")}});
  exec_runtime(*runtime_path, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpufence-runtime: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "gpufence-runtime: internal error\n";
  }
  return 1;
}
