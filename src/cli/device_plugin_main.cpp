// gpufence-device-plugin: the kubelet device plugin for nvidia.com/gpu.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "cli/health_flags.hpp"
#include "common/hostfs.hpp"
#include "common/http_server.hpp"
#include "common/log.hpp"
#include "common/stop_signals.hpp"
#include "common/strings.hpp"
#include "deviceplugin/cdi_spec.hpp"
#include "deviceplugin/plugin.hpp"
#include "distribution/distribution.hpp"
#include "gpu/nvml_inventory.hpp"
#include "kube/client.hpp"
#include "kube/events.hpp"
#include "podresources/podresources.hpp"

namespace {

using namespace gpufence;

int fail_startup(const std::string& message) {
  std::cerr << "gpufence-device-plugin: " << message << "\n";
  return 2;
}

// Ends the process with `code`. While a call is stuck in NVML, the thread inside it can be
// neither joined nor cancelled, and nothing it may touch (the NvmlInventory, the loaded library)
// may be destroyed under it; so once the kubelet-facing cleanup is done (streams ended, socket
// removed, both done by DevicePlugin::run before it returns) the process leaves with _exit and
// runs no destructors. Otherwise it returns `code` for main to return normally.
int leave(int code, NvmlWatchdog& nvml, Logger& log) {
  if (nvml.wait_idle(std::chrono::milliseconds(0))) return code;
  log.warn("plugin.nvml_abandoned",
           {{"call", nvml.overdue_call().value_or("an NVML call in flight")},
            {"action", "exit without waiting for it"}});
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

// The PodResources socket of the kubelet's default root (the chart passes the distribution's).
std::string pod_resources_socket_default() {
  return every_distribution(NodePath::pod_resources_socket).front();
}

int main(int argc, char** argv) try {
  // Before any thread exists (gRPC and the NVML watchdog start some); its descriptor is polled
  // beside every wait from the start, so a SIGTERM during a hung NVML start-up still ends the
  // plugin promptly and cleanly.
  auto stop = StopSignals::block();
  if (!stop) return fail_startup(stop.error().message);
  const int sfd = stop->fd();

  PluginOptions opt;
  std::string id_strategy = "uuid", list_strategy = "device-specs,volume-mounts,cdi-annotations";
  std::string nvml_library, log_file, log_level = "info", metrics_address, health_address,
                                      reregister_after = "30s", nvml_timeout = "10s",
                                      pod_resources_socket, node_name;
  bool no_cuda_env = false, in_cluster = false;
  cli::HealthFlags health_flags;

  CLI::App app{
      "gpufence-device-plugin: the kubelet device plugin for nvidia.com/gpu (Device Plugin API "
      "v1beta1)"};
  app.add_option("--plugin-dir", opt.plugin_dir,
                 "Kubelet device plugin directory (the distributions': " +
                     join(every_distribution(NodePath::device_plugin_dir), ", ") + ")")
      ->capture_default_str();
  app.add_option("--resource-name", opt.resource_name, "Extended resource to advertise")
      ->capture_default_str();
  app.add_option("--socket-name", opt.socket_name, "Socket file name in the plugin directory")
      ->capture_default_str();
  app.add_option("--device-id-strategy", id_strategy, "Device ids the kubelet sees: uuid or index")
      ->capture_default_str();
  app.add_option("--device-list-strategy", list_strategy,
                 "How Allocate carries the allocation, comma list of device-specs, volume-mounts, "
                 "cdi-annotations, cdi-cri, envvar")
      ->capture_default_str();
  app.add_flag("--no-cuda-visible-devices", no_cuda_env,
               "Do not set CUDA_VISIBLE_DEVICES to the allocated UUIDs");
  app.add_option("--cdi-annotation-prefix", opt.cdi_annotation_prefix,
                 "Prefix of the CDI annotation keys")
      ->capture_default_str();
  app.add_option(
         "--host-root", opt.host_root,
         "Root under which this process finds /dev/nvidia* and /proc (e.g. /host in a pod); "
         "it never changes the paths sent to the kubelet")
      ->capture_default_str();
  app.add_option("--dev-root", opt.dev_root,
                 "Root of the device nodes on the host as the container runtime sees it "
                 "(DeviceSpec host_path = DEV_ROOT/dev/nvidiaN; e.g. a driver container's root)")
      ->capture_default_str();
  app.add_option(
         "--cdi-spec-dir", opt.cdi_spec_dir,
         "Write the plugin's own CDI spec for the GPUs here (" + std::string(kPluginCdiSpecFile) +
             ") at start and keep it current, so a containerd with CDI on resolves "
             "the plugin's CDI names (an earlier release's " +
             std::string(kLegacyPluginCdiSpecFile) + " there is removed); \"off\" or \"\" disables")
      ->capture_default_str();
  app.add_option("--driver-root", opt.driver_root,
                 "Host path of the driver's root filesystem, for the CDI spec's driver files "
                 "(GPU Operator: /run/nvidia/driver)")
      ->capture_default_str();
  app.add_option("--cdi-hook-path", opt.cdi_hook_path,
                 "Host path of gpufence-runtime, run by the spec's update-ldcache hook")
      ->capture_default_str();
  app.add_option("--nvml-library", nvml_library,
                 "NVML library to dlopen (default: $GPUFENCE_NVML_LIBRARY or libnvidia-ml.so.1)");
  cli::add_health_flags(app, health_flags);
  app.add_option("--nvml-timeout", nvml_timeout,
                 "An NVML call that takes longer counts as hung: the GPU it was for becomes "
                 "Unhealthy (start-up calls get 6x as long)")
      ->capture_default_str();
  app.add_option("--reregister-after", reregister_after,
                 "Register again when no kubelet ListAndWatch stream has been open this long "
                 "(off: never)")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address,
                 "Serve Prometheus /metrics on HOST:PORT (e.g. 127.0.0.1:9400, :9400 for every "
                 "address); also /healthz there unless --health-address is given");
  app.add_option("--health-address", health_address,
                 "Serve the liveness /healthz on its own listener and thread at HOST:PORT (e.g. "
                 ":9401), so a flood of /metrics clients cannot fail the kubelet's probe");
  app.add_option("--pod-resources-socket", pod_resources_socket,
                 "The kubelet's PodResources socket, read at each scrape for the pods holding "
                 "each GPU (gpufence_gpu_info); \"off\" disables (default: " +
                     pod_resources_socket_default() + ")");
  app.add_flag("--in-cluster", in_cluster,
               "Post an Event on this node (--node-name) for each GPU health change, with the "
               "pod's service account");
  app.add_option("--node-name", node_name, "This node's name in the API (default: $NODE_NAME)");
  app.add_option("--log-file", log_file, "Append logs to this file instead of stderr");
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();
  app.footer(cat(
      "Example:\n"
      "  gpufence-device-plugin --metrics-address :9400\n"
      "  (registers nvidia.com/gpu with ",
      opt.plugin_dir, "/kubelet.sock and serves\n   ", opt.plugin_dir, "/", opt.socket_name, ")"));
  CLI11_PARSE(app, argc, argv);

  auto level = parse_log_level(log_level);
  if (!level) return fail_startup(level.error().message);
  Logger log(*level);
  if (!log_file.empty()) {
    if (auto st = log.open_file(log_file); !st) return fail_startup(st.error().message);
  }
  auto ids = parse_id_strategy(id_strategy);
  if (!ids) return fail_startup(ids.error().message);
  if (opt.cdi_spec_dir == "off") opt.cdi_spec_dir.clear();
  if (!opt.driver_root.starts_with("/"))
    return fail_startup("--driver-root '" + opt.driver_root + "' must be absolute");
  if (!opt.cdi_hook_path.starts_with("/"))
    return fail_startup("--cdi-hook-path '" + opt.cdi_hook_path + "' must be absolute");
  opt.id_strategy = *ids;
  auto lists = parse_list_strategies(list_strategy);
  if (!lists) return fail_startup(lists.error().message);
  opt.list_strategies = *lists;
  opt.set_cuda_visible_devices = !no_cuda_env;
  auto health_opt = cli::health_options(health_flags);
  if (!health_opt) return fail_startup(health_opt.error().message);
  opt.health = *health_opt;
  if (pod_resources_socket.empty()) pod_resources_socket = pod_resources_socket_default();
  if (node_name.empty())
    if (const char* env = std::getenv("NODE_NAME"); env && *env) node_name = env;
  std::unique_ptr<KubeClient> kube;
  if (in_cluster) {
    if (node_name.empty()) return fail_startup("--in-cluster needs --node-name or $NODE_NAME");
    auto creds = load_credentials("");
    if (!creds) return fail_startup("--in-cluster: " + creds.error().message);
    kube = make_rest_client(*creds);
  }
  auto rereg = parse_duration(reregister_after);
  if (!rereg) return fail_startup("--reregister-after: " + rereg.error().message);
  opt.reregister_after = *rereg;
  auto timeout = parse_duration(nvml_timeout);
  if (!timeout || !*timeout)
    return fail_startup("--nvml-timeout: " +
                        (timeout ? std::string("must not be off") : timeout.error().message));
  opt.nvml_timeout = **timeout;

  // Every NVML call, nvmlInit_v2 first, runs on the watchdog's thread with a deadline.
  NvmlWatchdog watchdog(opt.nvml_timeout);
  auto nvml = watchdog.call<Result<std::unique_ptr<NvmlInventory>>>(
      "nvmlInit_v2",
      [library = nvml_library_path(nvml_library), root = opt.host_root] {
        return NvmlInventory::open(library, HostFs(root));
      },
      sfd, opt.nvml_timeout * 6);
  if (!nvml && stop->stop_requested()) return leave(0, watchdog, log);
  if (!nvml) return leave(fail_startup(nvml.error().message), watchdog, log);

  PluginMetrics metrics;
  if (pod_resources_socket != "off") {
    metrics.set_gpu_holders([socket = pod_resources_socket, resource = opt.resource_name] {
      return list_pod_resources(socket, resource, std::chrono::seconds(2));
    });
  }
  PluginContext ctx{opt, log, **nvml, watchdog, metrics};
  // Each GPU health change as an Event on the Node, posted off the monitor's thread.
  std::unique_ptr<EventQueue> events;
  if (kube) {
    events = std::make_unique<EventQueue>(*kube,
                                          EventSource{"gpufence.io/device-plugin", node_name}, log);
    ctx.on_transition = [&events, node_name](const Gpu& gpu, const HealthTransition& tr) {
      events->post({"v1", "Node", "", node_name, ""},
                   {tr.healthy ? "Normal" : "Warning", "HealthChanged",
                    tr.healthy ? "GPUHealthy" : "GPUUnhealthy",
                    cat("GPU ", gpu.index, " (", gpu.uuid, ") is ",
                        tr.healthy ? "Healthy again" : "Unhealthy", ": ", tr.reason)});
    };
  }
  auto plugin = DevicePlugin::create(ctx, sfd);
  if (!plugin && stop->stop_requested()) return leave(0, watchdog, log);
  if (!plugin) return leave(fail_startup(plugin.error().message), watchdog, log);

  // /healthz on its own listener when asked (the chart does): the kubelet's liveness probe then
  // never queues behind /metrics clients. Without --health-address it stays on the metrics
  // listener, as in earlier releases, so manifests probing the metrics port keep working.
  HttpServer http, health;
  auto healthy = [&] { return (*plugin)->registered(); };
  const std::string unhealthy = "not registered with the kubelet";
  if (!health_address.empty()) {
    auto hst = health.start(health_address, {nullptr, healthy, unhealthy});
    if (!hst) return fail_startup("--health-address: " + hst.error().message);
    log.info("plugin.health",
             {{"address", health_address}, {"port", std::to_string(health.port())}});
  }
  if (!metrics_address.empty()) {
    auto mst =
        http.start(metrics_address,
                   {[&] { return metrics.render(opt.resource_name); },
                    health_address.empty() ? std::function<bool()>(healthy) : nullptr, unhealthy});
    if (!mst) return fail_startup("--metrics-address: " + mst.error().message);
    log.info("plugin.metrics",
             {{"address", metrics_address}, {"port", std::to_string(http.port())}});
  }

  auto st = (*plugin)->run(sfd);
  http.stop();
  health.stop();
  if (!st) log.error("plugin.failed", {{"error", st.error().message}});
  int code = st ? 0 : 1;
  plugin->reset();
  events.reset();  // after the plugin: its health monitor posts to it until then
  // nvmlShutdown can hang like any NVML call: unload on the watchdog, with a short deadline.
  NvmlInventory* inventory = nvml->release();
  (void)watchdog.call<Status>(
      "nvmlShutdown",
      [inventory] {
        delete inventory;
        return Status{};
      },
      -1, std::chrono::seconds(1));
  return leave(code, watchdog, log);
} catch (const std::exception& e) {
  std::cerr << "gpufence-device-plugin: internal error: " << e.what() << "\n";
  return 2;
}
