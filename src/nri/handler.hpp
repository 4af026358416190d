// gpufence-nri's handler: the decision of nri/adjust.hpp for each container NRI asks about, run
// within its budget on a worker, its log lines and refusals, and the status file the doctor
// reads (docs/nri.md).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nri/adjust.hpp"
#include "nri/service.hpp"
#include "nri/status.hpp"
#include "runtime/shim.hpp"

namespace gpufence::nri {

// The plugin's handler: decides each container, logs one escaped line per decision (the shim's
// format: nri.decision / nri.refused), and fails the creation where the shim would refuse. It
// keeps the status file (config's nri_status_file): connected or not, and what the last
// Synchronize showed, judged on a thread of its own so the runtime's answer never waits for it.
class GpufenceHandler : public PluginHandler {
 public:
  GpufenceHandler(ShimContext& ctx, std::string socket = "");
  ~GpufenceHandler() override;
  GpufenceHandler(const GpufenceHandler&) = delete;
  GpufenceHandler& operator=(const GpufenceHandler&) = delete;
  // A non-empty plugin config (containerd-launched: plugin_config_path/NN-name.conf) is a
  // runtime.toml and replaces the one read at start.
  Status configured(const RuntimeInfo& runtime) override;
  void synchronized(const api::SynchronizeRequest& request) override;
  Result<api::ContainerAdjustment> create_container(const api::PodSandbox& pod,
                                                    const api::Container& container,
                                                    SteadyTime received) override;
  const RuntimeInfo& runtime() const { return m_runtime; }
  // How a config's nvml_library becomes the inventory factory; set: a launched plugin's .conf
  // that names another library takes effect (unset in tests, which inject their inventory).
  std::function<InventoryFactory(const std::string&)> inventory_for;
  // The connection ended: `waiting` for the runtime to come back, or `exited` for good.
  void disconnected(NriState state);
  // Blocks until the judgement of the last complete Synchronize is in the status file.
  void wait_for_judgement();
  // The budget of one decision, counted from a request's arrival: 3/4 of the runtime's timeout.
  std::chrono::milliseconds decision_budget() const;

 private:
  struct StatusState;
  Result<NriDecision> decide_within_budget(const api::PodSandbox& pod,
                                           const api::Container& container, SteadyTime received);
  struct Worker;
  ShimContext& m_ctx;
  RuntimeInfo m_runtime;
  std::shared_ptr<Worker> m_worker;
  struct Hung;  // the decisions abandoned and still running, by pod
  std::shared_ptr<Hung> m_hung;
  std::shared_ptr<StatusState> m_status;
  std::vector<api::PodSandbox> m_sync_pods;  // a split Synchronize, gathered until its last chunk
  std::vector<api::Container> m_sync_containers;
  void count_decision(const Result<NriDecision>& decision, double seconds);
  // Writes counted decisions to the status file every few seconds (never on a request's path).
  std::jthread m_flusher;
};

}  // namespace gpufence::nri
