// `gpufence install --watch`: after the install, stay up, serve /healthz (and one gauge on
// /metrics), and install again whenever the running containerd has lost what the first run put in
// (a restart on a regenerated config, a snap refresh). Time goes by the InstallEnv's clock and
// sleep, so tests drive the loop on a fake clock.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "install/install.hpp"

namespace gpufence {

struct WatchOptions {
  // Loopback by default: on a host the port is no one else's business; in a pod (the chart's
  // node installer) 0.0.0.0:PORT, where the kubelet's httpGet probe connects.
  std::string healthz_address = "127.0.0.1:9402";
  std::chrono::milliseconds interval{30'000};  // between checks
};

// What the loop tells its caller and how it learns to stop: the CLI wires them to stdout, stderr
// and SIGTERM; tests script them.
struct WatchHooks {
  std::function<bool()> stop_requested;
  std::function<void(const InstallReport&)> reinstalled;  // each install the loop ran
  std::function<void(std::string_view line)> say;         // progress, one line each
};

// The loop alone, no listener: every `interval` (by env.now), asks whether the running containerd
// still has what `first` installed (its handler, NRI, or both), giving one that does not answer
// opt.ready_timeout to come back (it may be mid-restart) before installing again. `healthy`
// follows the answer. Returns once stop_requested says so (checked at least every 200 ms of
// env.sleep).
void watch_install_loop(const InstallOptions& opt, const InstallEnv& env,
                        const InstallReport& first, std::chrono::milliseconds interval,
                        std::atomic<bool>& healthy, const WatchHooks& hooks);

// /healthz (200 while healthy) and /metrics (gpufence_install_handler_loaded) on
// watch.healthz_address, then the loop. Fails only when the listener cannot start.
Status watch_install(const InstallOptions& opt, const InstallEnv& env, const InstallReport& first,
                     const WatchOptions& watch, const WatchHooks& hooks);

}  // namespace gpufence
