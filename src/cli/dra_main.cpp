// gpufence-dra: the DRA kubelet plugin for the node's GPUs (docs/dra.md).
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "cli/health_flags.hpp"
#include "common/hostfs.hpp"
#include "common/log.hpp"
#include "common/stop_signals.hpp"
#include "deviceplugin/health_monitor.hpp"
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

// Ends the process with `code`; while an NVML call is stuck, nothing it may touch can be
// destroyed under it, so the process leaves with _exit (as gpufence-device-plugin does).
int leave(int code, NvmlWatchdog& nvml) {
  if (nvml.wait_idle(std::chrono::milliseconds(0))) return code;
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

int main(int argc, char** argv) try {
  auto stop = StopSignals::block();
  if (!stop) return fail_startup(stop.error().message);
  const int sfd = stop->fd();

  DraOptions opt;
  std::string kubeconfig, nvml_library, log_level = "info", log_file, slice_check = "5s",
                                        nvml_timeout = "10s", registry_dir = opt.registry_dir,
                                        state_dir = opt.state_dir, no_execute_xids = "79";
  cli::HealthFlags health_flags;
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
  cli::add_health_flags(app, health_flags);
  app.add_option("--no-execute-xids", no_execute_xids,
                 "XIDs whose GPU's taint is NoExecute (its pods evicted), not NoSchedule; a lost "
                 "GPU always is")
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

  auto health_opt = cli::health_options(health_flags);
  if (!health_opt) return fail_startup(health_opt.error().message);
  HealthOptions health = *health_opt;
  auto no_exec = parse_xid_list(no_execute_xids);
  if (!no_exec) return fail_startup("--no-execute-xids: " + no_exec.error().message);

  auto creds = load_credentials(kubeconfig);
  if (!creds) return fail_startup(creds.error().message);
  auto kube = make_rest_client(std::move(*creds));

  // The GPUs, once: a new GPU set means a restart (as for the device plugin). Every NVML call
  // runs on the watchdog's thread with a deadline.
  NvmlWatchdog watchdog(**timeout);
  auto nvml = watchdog.call<Result<std::unique_ptr<NvmlInventory>>>(
      "nvmlInit_v2",
      [library = nvml_library_path(nvml_library), root = opt.host_root] {
        return NvmlInventory::open(library, HostFs(root));
      },
      sfd, **timeout * 6);
  if (!nvml) return leave(fail_startup(nvml.error().message), watchdog);
  NvmlInventory& inventory = **nvml;
  auto gpus = watchdog.call<Result<std::vector<Gpu>>>(
      "nvmlDeviceGetCount", [&inventory] { return inventory.gpus(); }, sfd, **timeout * 6);
  if (!gpus) return leave(fail_startup(gpus.error().message), watchdog);

  // The device plugin's health monitor: NVML XIDs and lost GPUs, the same policy.
  std::vector<MonitoredGpu> monitored;
  for (const Gpu& g : *gpus) monitored.push_back({dra_device_name(g), g.uuid});
  DraDriver* driver_at = nullptr;
  HealthMonitor monitor(inventory, watchdog, monitored, health, log, [&driver_at] {
    if (driver_at) driver_at->health_changed();
  });
  std::vector<std::string> uuids;
  for (const Gpu& g : *gpus) uuids.push_back(g.uuid);
  DraHealthView view = [&monitor, uuids, xids = *no_exec] {
    std::map<std::string, DraDeviceHealth> out;
    for (const auto& u : uuids) out[u] = dra_health_of(monitor.healthy(u), monitor.reason(u), xids);
    return out;
  };
  DraDriver driver(opt, *kube, std::move(*gpus), log, view);
  driver_at = &driver;
  if (auto st = monitor.start(); !st) return leave(fail_startup(st.error().message), watchdog);
  auto st = driver.run(sfd);
  monitor.stop();
  driver_at = nullptr;
  if (!st) log.error("dra.failed", {{"error", st.error().message}});
  return leave(st ? 0 : 1, watchdog);
} catch (const std::exception& e) {
  std::cerr << "gpufence-dra: internal error: " << e.what() << "\n";
  return 2;
}
