// gpufence-runtime: the OCI runtime a containerd runtime handler's BinaryName points at. It takes
// runc's command line; on create/run it narrows the bundle's spec to the allocated GPUs, then
// execs the low-level runtime with the original arguments. It never throws past main and fails
// closed: if it cannot prove what a container may have, the container does not start.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <iostream>

#include "common/escape.hpp"
#include "common/hostfs.hpp"
#include "common/paths.hpp"
#include "common/process.hpp"
#include "common/strings.hpp"
#include "gpu/nvml_inventory.hpp"
#include "runtime/hooks.hpp"
#include "runtime/runc_log.hpp"
#include "runtime/shim.hpp"

namespace {

using namespace gpufence;

std::string usage() {
  return cat(
      "usage: gpufence-runtime [runc global flags] <command> [flags] <container-id>\n"
      "\n"
      "An OCI runtime shim with runc's command line. On 'create' and 'run' it rewrites\n"
      "<bundle>/config.json so the container gets exactly the GPUs the kubelet allocated to it\n"
      "(the device plugin's CDI annotations and the kubelet's device specs; mount markers only\n"
      "when one of those names the same GPU, or alone in a privileged spec; never the pod's own\n"
      "NVIDIA_VISIBLE_DEVICES unless trusted_channels has \"envvar\"), even when privileged; then "
      "it\n"
      "execs the low-level runtime (runc) with the same arguments. 'restore' is edited the same\n"
      "way. Every other command, and --help or --version, goes to runc untouched. A refusal is\n"
      "written to stderr and, as runc would, to the --log file containerd reads it from.\n"
      "\n"
      "  gpufence-runtime hook driver-procfs --dir D --keep ENTRY...   (OCI createContainer hook)\n"
      "  gpufence-runtime hook update-ldcache --folder DIR...          (OCI createContainer hook)\n"
      "\n"
      "Configuration: ",
      paths::kRuntimeConfig,
      ", or the file named by $GPUFENCE_RUNTIME_CONFIG\n"
      "(every key documented in deploy/runtime.toml). NVML: $GPUFENCE_NVML_LIBRARY overrides\n"
      "libnvidia-ml.so.1 when [devices] nvml_library is unset.\n"
      "\n"
      "Example containerd handler (config version 2):\n"
      "  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
      "    runtime_type = \"io.containerd.runc.v2\"\n"
      "    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
      "      BinaryName = \"",
      paths::kRuntimeBinary, "\"\n");
}

// A refused create: one line on stderr (direct use) and, when containerd passed --log, the same
// message where containerd reads the runtime's error from (docs/containerd-runtime.md).
int refuse(const RuncInvocation& inv, const std::string& why) {
  // Pod-chosen bytes (a mount destination, a device path) reach stderr and containerd's error
  // as data (common/escape.hpp).
  std::string msg =
      escape_text(inv.container_id.empty() ? "gpufence-runtime: refusing the command line: " + why
                                           : "gpufence-runtime: refusing to create container " +
                                                 inv.container_id + ": " + why);
  std::cerr << msg << "\n";
  if (!inv.log_path.empty()) {
    auto line = runc_log_line(inv.log_format, "error", msg, std::chrono::system_clock::now());
    if (auto st = append_runc_log(inv.log_path, line); !st)
      std::cerr << "gpufence-runtime: " << st.error().message << "\n";
  }
  return 1;
}

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
    std::cout << usage();
    return 0;
  }
  // Our own OCI hooks, added to specs by the create path below.
  if (!args.empty() && args[0] == "hook")
    return run_hook(std::vector<std::string>(args.begin() + 1, args.end()));
  // Fails closed: a command line runc 1.1 would reject is not passed on, so no reading of it
  // can differ from runc's about which bundle is created.
  const RuncInvocation inv = parse_runc_args(args);
  if (!inv.unreadable.empty()) return refuse(inv, inv.unreadable);

  auto config = load_runtime_config();
  if (!inv.edits_spec()) {
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

  if (!config) return refuse(inv, config.error().message);
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
    log.error("runtime.refused",
              {{"container", inv.container_id}, {"error", runtime_path.error().message}});
    return refuse(inv, runtime_path.error().message);
  }
  std::string exe = self_executable();
  if (exe.empty()) return refuse(inv, "cannot read /proc/self/exe for the hooks it adds");

  ShimContext ctx{*config, log, host_nvml_inventory(config->nvml_library), exe};
  auto decision = prepare_bundle(inv, ctx);
  if (!decision) {
    log.error("runtime.refused", {{"container", inv.container_id},
                                  {"bundle", inv.bundle},
                                  {"error", decision.error().message}});
    return refuse(inv, decision.error().message);
  }
  if (!decision->ignored.empty()) {
    log.info("runtime.ignored",
             {{"container", decision->container_id}, {"what", join(decision->ignored, "; ")}});
  }
  log.info("runtime.decision", {{"container", decision->container_id},
                                {"command", inv.subcommand},
                                {"channel", std::string(channel_name(decision->channel))},
                                // Key kept: scripts and docs/containerd-runtime.md read it.
                                {"privileged", decision->admits_all_devices ? "true" : "false"},
                                {"passthrough", decision->passthrough ? "true" : "false"},
                                {"granted", join(decision->granted, ",")},
                                {"removed", join(decision->removed_nodes, ",")},
                                {"whitelist", decision->whitelisted ? "true" : "false"},
                                {"spec_changed", decision->spec_changed ? "true" : "false"},
                                {"gpus_from", decision->inventory_source},
                                {"cdi", join(decision->cdi_devices, ",")},
                                {"nodes", join(decision->granted_nodes, ",")},
                                {"cdi_mounts", join(decision->cdi_mounts, ",")}});
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
