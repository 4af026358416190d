// gpufence-dra: the DRA kubelet plugin for the node's GPUs (docs/dra.md). Registers with the
// kubelet's plugin watcher (one socket in plugins_registry serving the registration, DRAPlugin v1
// and the DRAResourceHealth stream), publishes the node's ResourceSlice and keeps it published
// (the kubelet deletes the node's slices when it starts), prepares claims by reading them from the
// API server and answering gpufence's own CDI names, which gpufence-nri enforces like a device
// plugin's, and checkpoints what it prepared so a restart prepares nothing twice.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/paths.hpp"
#include "deviceplugin/cdi_spec.hpp"
#include "dra/model.hpp"
#include "gpu/gpu.hpp"
#include "kube/client.hpp"

namespace gpufence {

struct DraOptions {
  DraIdentity id;
  // The kubelet's plugin watcher directory: <root-dir>/plugins_registry. The socket's path must
  // be the same in this process and on the host (the kubelet dials the endpoint we name).
  std::filesystem::path registry_dir = "/var/lib/kubelet/plugins_registry";
  // Where the checkpoint of prepared claims lives: a directory of gpufence's own, no pod's.
  std::filesystem::path state_dir = paths::kDraStateDir;
  // How often the slice is checked (and re-created after the kubelet deleted it).
  std::chrono::milliseconds slice_check = std::chrono::seconds(5);
  // The CDI spec for gpufence.io/gpu (the same as the device plugin's); dir "" = not written.
  PluginCdiSpecOptions cdi;
  std::string host_root = "/";
};

std::string dra_socket_name(const DraIdentity& id);  // "<driver>-reg.sock"

// The GPUs' health now, by uuid (absent: healthy). gpufence-dra's main reads the device plugin's
// HealthMonitor; tests give their own.
using DraHealthView = std::function<std::map<std::string, DraDeviceHealth>()>;

class DraDriver {
 public:
  DraDriver(DraOptions options, KubeClient& kube, std::vector<Gpu> gpus, Logger& log,
            DraHealthView health = {});
  ~DraDriver();
  DraDriver(const DraDriver&) = delete;
  DraDriver& operator=(const DraDriver&) = delete;

  // Loads the checkpoint, writes the CDI spec, serves the socket, keeps the slice published,
  // until `stop_fd` is readable; then stops serving and removes the socket. Fails when the
  // checkpoint cannot be read or the socket cannot be served.
  Status run(int stop_fd);

  // The socket's path (registry_dir / dra_socket_name).
  std::filesystem::path socket_path() const;

  // Some GPU's health changed (thread-safe): the health stream sends the list again and the
  // slice is republished with its taints.
  void health_changed();

  struct State;

 private:
  std::unique_ptr<State> m_state;
};

}  // namespace gpufence
