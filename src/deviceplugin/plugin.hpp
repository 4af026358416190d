// gpufence-device-plugin's server: discovery, the DevicePlugin gRPC service, registration with
// the kubelet (registration.hpp) and the health monitor (health_monitor.hpp).
#pragma once

#include <functional>
#include <memory>

#include "common/log.hpp"
#include "deviceplugin/health.hpp"
#include "deviceplugin/metrics.hpp"
#include "deviceplugin/options.hpp"
#include "deviceplugin/watchdog.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

// One per process: what the plugin needs from the outside world.
struct PluginContext {
  PluginOptions options;
  Logger& log;
  GpuInventory& inventory;  // called only through `watchdog`
  NvmlWatchdog& watchdog;
  PluginMetrics& metrics;
  // Called on the health monitor's thread for each GPU health change, after its log line; must
  // not block (the device plugin's Node Events queue it: kube/events.hpp EventQueue).
  std::function<void(const Gpu&, const HealthTransition&)> on_transition = nullptr;
};

class DevicePlugin {
 public:
  // Discovers the GPUs and their topology; fails when NVML cannot list them, does not answer in
  // time, or `stop_fd` (when >= 0) becomes readable meanwhile.
  static Result<std::unique_ptr<DevicePlugin>> create(PluginContext ctx, int stop_fd = -1);
  ~DevicePlugin();

  // Serves and registers until `stop_fd` becomes readable (StopSignals::fd, a pipe in tests): waits
  // for the kubelet's socket, re-serves and re-registers when the kubelet restarts, and on stop
  // ends every stream, shuts the server down within a second and removes its socket.
  Status run(int stop_fd);

  bool registered() const;

  struct State;

 private:
  explicit DevicePlugin(std::unique_ptr<State> state);
  std::unique_ptr<State> m_state;
};

}  // namespace gpufence
