// `gpufence autoscale` as a process: the Lease it elects a leader on, the demand and cluster
// sources its flags name, and the loop that reconciles every period until stopped and then gives
// the Lease back. Time and sleep come from a seam, so tests drive the loop on a fake clock.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "autoscale/controller.hpp"
#include "common/error.hpp"

namespace gpufence {

// This replica's name in the Lease and in Events: the pod's name (the Downward API's POD_NAME, or
// HOSTNAME, which a pod's hostname defaults to) plus the pid, as client-go adds a unique part.
std::string default_identity();

// The Lease named by `spec` ("NAMESPACE/NAME"; empty: the Deployment's namespace,
// gpufence-autoscale-DEPLOYMENT), held `duration` unrenewed (zero: three periods, at least 15 s,
// so the leader's own renewals never lapse between reconciles).
Result<LeaseOptions> lease_options(const AutoscaleOptions& opt, const std::string& spec,
                                   std::string identity, std::chrono::seconds duration,
                                   std::chrono::seconds period);

struct LoopClock {
  std::function<SteadyTime()> now;
  std::function<void(std::chrono::milliseconds)> sleep;
};
LoopClock system_loop_clock();

enum class Repeat { once, every_period };

struct AutoscaleLoop {
  std::chrono::milliseconds period{15'000};
  Repeat repeat = Repeat::every_period;
  std::function<bool()> stop_requested;                 // SIGTERM in the CLI
  std::function<void(const Controller::Step&)> report;  // each reconcile, as it happens
  LoopClock clock;
};

struct LoopEnd {
  bool last_step_failed = false;  // the exit status: 1 when the last reconcile failed
  Status released;                // giving the Lease back on the way out
};

// Reconciles at once and then every period (stop_requested is looked at every 100 ms of sleep)
// until stopped or after one with Repeat::once; then gives the Lease up, so a peer takes over at
// once instead of after the lease duration.
LoopEnd run_autoscale_loop(Controller& controller, const AutoscaleLoop& loop);

// What the flags chose, for run_autoscale.
struct AutoscaleRun {
  AutoscaleOptions opt;
  std::string streams_file, streams_configmap;  // exactly one is set
  std::optional<LeaseOptions> lease;            // none: --no-leader-election
  std::string instance;                         // Events' reportingInstance
};

// The whole command over `kube`: demand from the file or ConfigMap; nodes and pods listed each
// time (Repeat::once) or kept by list + watch; the Controller in the loop. `say` gets the lines a
// failed watch start prints (the watch retries in the background).
LoopEnd run_autoscale(KubeClient& kube, const AutoscaleRun& run, const AutoscaleLoop& loop,
                      const std::function<void(std::string_view)>& say);

// One reconcile as the operator reads it: the decision on `out`, warnings and errors on `err`.
void write_step(std::ostream& out, std::ostream& err, const std::string& deployment,
                const Controller::Step& step, bool dry_run);

}  // namespace gpufence
