// gpufence-dra: the DRA kubelet plugin for the node's GPUs (docs/dra.md).
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "common/hostfs.hpp"
#include "common/log.hpp"
#include "common/stop_signals.hpp"
#include "deviceplugin/options.hpp"
#include "deviceplugin/watchdog.hpp"
#include "dra/driver.hpp"
#include "gpu/nvml_inventory.hpp"
#include "kube/client.hpp"

namespace {

using namespace gpufence;

int fail_startup(const std::string& message) {
  std::cerr << "gpufence-dra: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  auto stop = StopSignals::block();
  if (!stop) return fail_startup(stop.error().message);
  const int sfd = stop->fd();

  DraOptions opt;
  std::string kubeconfig, nvml_library, log_level = "info", log_file, slice_check = "5s",
                                        nvml_timeout = "10s", registry_dir = opt.registry_dir,
                                        state_dir = opt.state_dir;
  if (const char* n = std::getenv("NODE_NAME")) opt.id.node = n;

  CLI::App app{
      "gpufence-dra: the DRA kubelet plugin for the node's GPUs (DRAPlugin v1): publishes one "
      "ResourceSlice per node and prepares claims as gpufence's CDI devices"};
  app.add_option("--node-name", opt.id.node, "this node's name (default: $NODE_NAME)");
  app.add_option("--driver-name", opt.id.driver, "the DRA driver name (DeviceClass selectors)")
      ->capture_default_str();
  app.add_option("--kubeconfig", kubeconfig, "kubeconfig (default: in-cluster credentials)");
  app.add_option("--registry-dir", registry_dir,
                 "the kubelet's plugin watcher directory (<root-dir>/plugins_registry)")
      ->capture_default_str();
  app.add_option("--state-dir", state_dir, "where prepared claims are checkpointed (root's own)")
      ->capture_default_str();
  app.add_option("--slice-check", slice_check, "how often the ResourceSlice is checked")
      ->capture_default_str();
  app.add_option("--cdi-spec-dir", opt.cdi.dir, "where the gpufence.io/gpu CDI spec is written")
      ->capture_default_str();
  app.add_option("--cdi-hook-path", opt.cdi.hook_path, "host path of gpufence-runtime")
      ->capture_default_str();
  app.add_option("--dev-root", opt.cdi.dev_root, "device nodes' root as the runtime sees it")
      ->capture_default_str();
  app.add_option("--driver-root", opt.cdi.driver_root, "the driver's root on the host")
      ->capture_default_str();
  app.add_option("--host-root", opt.host_root, "where the host's filesystem is mounted")
      ->capture_default_str();
  app.add_option("--nvml-library", nvml_library, "libnvidia-ml.so.1 to load");
  app.add_option("--nvml-timeout", nvml_timeout, "how long one NVML call may take")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
  app.add_option("--log-file", log_file, "append logs here instead of stderr");
  CLI11_PARSE(app, argc, argv);

  auto level = parse_log_level(log_level);
  if (!level) return fail_startup(level.error().message);
  Logger log(*level);
  if (!log_file.empty())
    if (auto st = log.open_file(log_file); !st) return fail_startup(st.error().message);
  if (opt.id.node.empty()) return fail_startup("--node-name (or $NODE_NAME) is required");
  if (opt.cdi.dir == "off") opt.cdi.dir.clear();
  opt.registry_dir = registry_dir;
  opt.state_dir = state_dir;
  auto check = parse_duration(slice_check);
  if (!check || !*check)
    return fail_startup("--slice-check: " +
                        (check ? std::string("must not be off") : check.error().message));
  opt.slice_check = **check;
  auto timeout = parse_duration(nvml_timeout);
  if (!timeout || !*timeout)
    return fail_startup("--nvml-timeout: " +
                        (timeout ? std::string("must not be off") : timeout.error().message));

  auto creds = load_credentials(kubeconfig);
  if (!creds) return fail_startup(creds.error().message);
  auto kube = make_rest_client(std::move(*creds));

  // The GPUs, once: a new GPU set means a restart (as for the device plugin).
  NvmlWatchdog watchdog(**timeout);
  auto gpus = watchdog.call<Result<std::vector<Gpu>>>(
      "nvmlInit_v2",
      [library = nvml_library_path(nvml_library), root = opt.host_root]() -> Result<std::vector<Gpu>> {
        auto nvml = NvmlInventory::open(library, HostFs(root));
        if (!nvml) return std::unexpected(nvml.error());
        return (*nvml)->gpus();
      },
      sfd, **timeout * 6);
  if (!gpus) return fail_startup(gpus.error().message);

  DraDriver driver(opt, *kube, std::move(*gpus), log);
  auto st = driver.run(sfd);
  if (!st) {
    log.error("dra.failed", {{"error", st.error().message}});
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "gpufence-dra: internal error: " << e.what() << "\n";
  return 2;
}
