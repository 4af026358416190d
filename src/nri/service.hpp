// The plugin side of an NRI connection, transport-free: which NRI API the runtime speaks, the
// event subscription, and the answer to each ttrpc request the runtime sends on conn 1.
// Facts (docs/nri.md): services nri.pkg.api.v1alpha1.{Plugin,Runtime}, methods named as the rpcs
// (nri@v0.12.0:pkg/api/api_ttrpc.pb.go); a runtime rejects event bits outside its ValidEvents and
// reads a mask of 0 as "all events" (nri@v0.12.0:pkg/adaptation/plugin.go `configure`).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "nri/v1alpha1/api.pb.h"
#include "nri/wire.hpp"

namespace gpufence::nri {

namespace api = ::nri::pkg::api::v1alpha1;

inline constexpr std::string_view kPluginService = "nri.pkg.api.v1alpha1.Plugin";
inline constexpr std::string_view kRuntimeService = "nri.pkg.api.v1alpha1.Runtime";
// The NRI API version this plugin was written against, sent in RegisterPlugin (v0.12 field 3).
inline constexpr std::string_view kPluginNriVersion = "v0.12.0";

// gRPC status codes as ttrpc carries them (google.golang.org/grpc/codes).
enum class StatusCode : int32_t {
  ok = 0,
  unknown = 2,
  invalid_argument = 3,
  failed_precondition = 9,
  unimplemented = 12,
  internal = 13,
};

struct NriVersion {
  int major = 0, minor = 0, patch = 0;
  auto operator<=>(const NriVersion&) const = default;
};

// "v0.12.0", "0.10.1" -> version; nullopt for "", "(devel)", "0.0.0-unknown".
std::optional<NriVersion> parse_nri_version(std::string_view text);
// The NRI API a runtime that does not announce one speaks, from its name and version, as
// nri@v0.12.0:pkg/api/version.go InferVersionFromRuntime does for containerd.
std::optional<NriVersion> infer_nri_version(std::string_view runtime_name,
                                            std::string_view runtime_version);

struct RuntimeInfo {
  std::string name;     // "containerd"
  std::string version;  // "v2.3.4"
  std::optional<NriVersion> nri;
  bool device_rules = false;  // linux.resources.devices adjustments applied: NRI >= v0.10
  int64_t request_timeout_ms = 2000;
  std::string config;  // a launched plugin's NN-name.conf from plugin_config_path, verbatim
  std::string nri_text() const;
};

RuntimeInfo runtime_info(const api::ConfigureRequest& request);

// Events gpufence-nri subscribes to: CreateContainer only (the decision), valid on every runtime.
uint32_t subscribed_events();
inline constexpr uint32_t event_bit(api::Event e) {
  return 1u << (static_cast<int>(e) - 1);
}

// The most a refusal's message carries to containerd: it reaches the user through the kubelet's
// event, and an answer must stay far below ttrpc's 4 MiB whatever a pod put into it.
inline constexpr size_t kMaxStatusMessageBytes = 4096;

using SteadyTime = std::chrono::steady_clock::time_point;

// What the plugin decides; implemented by the gpufence-nri adjuster (decider), the fence, and by
// fakes in tests.
class PluginHandler {
 public:
  virtual ~PluginHandler() = default;
  // The events to subscribe to on this runtime (ConfigureResponse.events).
  virtual uint32_t events() const { return subscribed_events(); }
  // An error fails Configure: the runtime drops the plugin (and kills a launched one).
  virtual Status configured(const RuntimeInfo& runtime) = 0;
  virtual void synchronized(const api::SynchronizeRequest& request) = 0;
  // The adjustment for a container being created; an error fails the creation (containerd:
  // "failed to get NRI adjustment for container"), its message is what the user sees.
  // `received`: when the request arrived; the decision's budget counts from there.
  virtual Result<api::ContainerAdjustment> create_container(const api::PodSandbox& pod,
                                                            const api::Container& container,
                                                            SteadyTime received) = 0;
  // ValidateContainerAdjustment (NRI >= v0.10), sent only to a plugin that subscribed to it.
  virtual api::ValidateContainerAdjustmentResponse validate(
      const api::ValidateContainerAdjustmentRequest&) {
    return {};
  }
};

// The response to one ttrpc message received on conn 1 (the plugin's service). Requests for the
// plugin service's other methods get their empty OK answer; a method NRI does not define gets
// Unimplemented (as ttrpc's server does); a payload that does not decode gets InvalidArgument.
// Every answer can be sent: an error's message is one bounded line (kMaxStatusMessageBytes), and
// an answer over ttrpc's limit becomes a short error for that request, never a broken session.
TtrpcMessage answer_request(const TtrpcMessage& request, PluginHandler& handler);

// The RegisterPlugin call (conn 2): the ttrpc request the plugin sends first.
TtrpcMessage register_request(uint32_t stream, std::string_view name, std::string_view index);
// Reads the runtime's answer to a call: ok, or the status it carries.
Status read_call_response(const TtrpcMessage& response);

}  // namespace gpufence::nri
