// The fence: a second, minimal NRI plugin (the same binary, its own process) that validates every
// container's merged adjustment (NRI >= v0.10: ValidateContainerAdjustment, containerd >= 2.2)
// and rejects a container gpufence-nri did not decide.
//
// Why (docs/nri.md, "When gpufence-nri is gone"): a plugin that times out or closes its
// connection mid-request is dropped for that call and the container is created as CRI made it,
// while the default validator still counts the plugin as present for `required_plugins` (the
// runtime lists the plugins it calls before calling them: nri@v0.12.0 pkg/adaptation/adaptation.go
// CreateContainer, containerd/nri#316). A validator that fails, times out or is gone fails the
// creation instead (plugin.go ValidateContainerAdjustment returns its error; a validator missing
// from `required_plugins` fails it too). So the decider stamps every decision with its mark
// (kDecidedAnnotation = the container's id), and the fence refuses every adjustment that lacks
// it. The fence reads no file, calls no driver and copies nothing: it cannot hang on what the
// decider can hang on.
#pragma once

#include <string>

#include "common/log.hpp"
#include "nri/service.hpp"

namespace gpufence::nri {

// The plugin name the fence registers under (install links plugin_path/20-gpufence-fence).
inline constexpr std::string_view kFencePluginName = "gpufence-fence";
// NRI's Field enum (nri@v0.12.0 pkg/api/api.proto `Field`): 1 is Annotations.
inline constexpr int32_t kFieldAnnotations = 1;

// Why the fence rejects this adjustment, or nullopt to let it through. `decider` is the decider's
// plugin name ("gpufence-nri"): the mark must be set by it ("NN-gpufence-nri" in the owners).
std::optional<std::string> fence_rejection(const api::ValidateContainerAdjustmentRequest& request,
                                           std::string_view decider);

class FenceHandler : public PluginHandler {
 public:
  FenceHandler(Logger& log, std::string decider) : m_log(log), m_decider(std::move(decider)) {}
  uint32_t events() const override;
  // A runtime without adjustment validation (NRI below v0.10) cannot run a fence: refused, so the
  // runtime drops it with the reason in its log.
  Status configured(const RuntimeInfo& runtime) override;
  void synchronized(const api::SynchronizeRequest&) override {}
  Result<api::ContainerAdjustment> create_container(const api::PodSandbox&, const api::Container&,
                                                    SteadyTime) override {
    return api::ContainerAdjustment{};  // not subscribed
  }
  api::ValidateContainerAdjustmentResponse validate(
      const api::ValidateContainerAdjustmentRequest& request) override;

 private:
  Logger& m_log;
  std::string m_decider;
};

}  // namespace gpufence::nri
