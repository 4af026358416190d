// gpufence-test-kubelet: starts the test kubelet on a plugin directory, waits for a device
// plugin to register and list its devices, admits containers as a kubelet does
// (GetPreferredAllocation, then Allocate), prints each container's allocation one fact per line,
// and stops. For the demo and for trying the plugin by hand; not a kubelet.
//
// Output lines (container index first):
//   <i> ids <id>[,<id>...]
//   <i> device <container_path> <host_path> <permissions>
//   <i> mount <container_path> <host_path> <ro|rw>
//   <i> env <KEY>=<value>
//   <i> annotation <key>=<value>
//   <i> cdi <name>
#include <CLI/CLI.hpp>

#include <chrono>
#include <iostream>

#include "common/stop_signals.hpp"
#include "common/strings.hpp"
#include "pod_resources_server.hpp"
#include "test_kubelet.hpp"

int main(int argc, char** argv) {
  std::string plugin_dir;
  int containers = 1, per_container = 1, timeout_s = 10;
  CLI::App app{
      "gpufence-test-kubelet: a stand-in kubelet that admits containers through a device plugin"};
  auto* plugin_dir_opt = app.add_option("--plugin-dir", plugin_dir,
                                        "Device plugin directory to serve kubelet.sock in");
  app.add_option("--admit", containers, "Containers to admit")->capture_default_str();
  app.add_option("--gpus", per_container, "Devices per container")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Seconds to wait for the plugin")->capture_default_str();
  bool upstream_run_client = false;
  app.add_flag("--upstream-run-client", upstream_run_client,
               "Keep clients as the real kubelet does: the end of any client's ListAndWatch "
               "disconnects the client current for the resource and marks its devices Unhealthy");
  app.footer(
      "Example:\n  gpufence-test-kubelet --plugin-dir /tmp/dp --admit 2\n  0 ids GPU-5a1c...\n  0 "
      "mount /var/run/nvidia-container-devices/GPU-5a1c... /dev/null ro");
  std::string pod_resources;
  std::vector<std::string> pods, allocatable;
  app.add_option("--pod-resources", pod_resources,
                 "Instead: serve the PodResources API on this socket until SIGTERM, with --pod and "
                 "--allocatable");
  app.add_option("--pod", pods,
                 "NAMESPACE/POD/CONTAINER=ID[,ID...] allocation to report (repeatable)");
  app.add_option("--allocatable", allocatable, "Allocatable device id (repeatable)");
  plugin_dir_opt->required(false);
  CLI11_PARSE(app, argc, argv);

  if (!pod_resources.empty()) {
    std::vector<gpufence::test::PodAllocation> allocations;
    for (const auto& p : pods) {
      auto eq = p.find('=');
      auto parts = gpufence::split(std::string_view(p).substr(0, eq), '/');
      if (parts.size() != 3) {
        std::cerr << "gpufence-test-kubelet: --pod wants NAMESPACE/POD/CONTAINER=IDS, got " << p
                  << "\n";
        return 2;
      }
      gpufence::test::PodAllocation a{
          std::string(parts[0]), std::string(parts[1]), std::string(parts[2]), {}};
      if (eq != std::string::npos) {
        for (auto id : gpufence::split(std::string_view(p).substr(eq + 1), ',')) {
          if (!id.empty()) a.device_ids.emplace_back(id);
        }
      }
      allocations.push_back(std::move(a));
    }
    // Before the server's threads start (common/stop_signals.hpp).
    auto stop = gpufence::StopSignals::block();
    if (!stop) {
      std::cerr << "gpufence-test-kubelet: " << stop.error().message << "\n";
      return 1;
    }
    gpufence::test::PodResourcesServer server(pod_resources, "nvidia.com/gpu", allocations,
                                              allocatable);
    if (!server.start()) {
      std::cerr << "gpufence-test-kubelet: cannot serve " << pod_resources << "\n";
      return 1;
    }
    while (!stop->wait_for(std::chrono::hours(1))) {
    }
    return 0;
  }
  if (plugin_dir.empty()) {
    std::cerr << "gpufence-test-kubelet: --plugin-dir is required\n";
    return 2;
  }

  gpufence::test::TestKubelet kubelet(plugin_dir);
  if (upstream_run_client) kubelet.emulate_upstream_run_client();
  kubelet.start();
  auto timeout = std::chrono::seconds(timeout_s);
  if (!kubelet.wait_registrations(1, timeout) ||
      !kubelet.wait_devices([](const auto& d) { return !d.empty(); }, timeout)) {
    std::cerr << "gpufence-test-kubelet: no device plugin registered within " << timeout_s << "s\n";
    return 1;
  }
  for (int i = 0; i < containers; ++i) {
    v1beta1::ContainerAllocateResponse r;
    std::vector<std::string> ids;
    auto st = kubelet.admit(per_container, &r, &ids);
    if (!st.ok()) {
      std::cerr << "gpufence-test-kubelet: container " << i << ": " << st.error_message() << "\n";
      return 1;
    }
    std::cout << i << " ids " << gpufence::join(ids, ",") << "\n";
    for (const auto& d : r.devices()) {
      std::cout << i << " device " << d.container_path() << " " << d.host_path() << " "
                << d.permissions() << "\n";
    }
    for (const auto& m : r.mounts()) {
      std::cout << i << " mount " << m.container_path() << " " << m.host_path() << " "
                << (m.read_only() ? "ro" : "rw") << "\n";
    }
    for (const auto& [k, v] : r.envs()) std::cout << i << " env " << k << "=" << v << "\n";
    for (const auto& [k, v] : r.annotations())
      std::cout << i << " annotation " << k << "=" << v << "\n";
    for (const auto& c : r.cdi_devices()) std::cout << i << " cdi " << c.name() << "\n";
  }
  kubelet.stop();
  return 0;
}
