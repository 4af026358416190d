#include "nri/service.hpp"

#include <charconv>

#include "common/escape.hpp"
#include "common/strings.hpp"
#include "ttrpc/request.pb.h"

namespace gpufence::nri {
namespace {

TtrpcMessage response_message(uint32_t stream, StatusCode code, std::string_view message,
                              const std::string& payload) {
  ::ttrpc::Response response;
  // ttrpc's Go server omits the status on success (ttrpc@v1.2.8:services.go unaryCall).
  if (code != StatusCode::ok) {
    response.mutable_status()->set_code(static_cast<int32_t>(code));
    // proto3 strings must be UTF-8 or the whole response fails to decode in Go. Pod bytes in
    // the message were escaped where they were quoted: escaped once, never again here.
    response.mutable_status()->set_message(bounded_line(message, kMaxStatusMessageBytes));
  }
  response.set_payload(payload);
  TtrpcMessage out{stream, static_cast<uint8_t>(TtrpcType::response), 0, {}};
  response.SerializeToString(&out.data);
  return out;
}

TtrpcMessage ok(uint32_t stream, const google::protobuf::MessageLite& payload) {
  return response_message(stream, StatusCode::ok, "", payload.SerializeAsString());
}

TtrpcMessage error(uint32_t stream, StatusCode code, std::string_view message) {
  return response_message(stream, code, message, "");
}

template <typename T>
bool decode(const std::string& payload, T& message) {
  return message.ParseFromString(payload);
}

StatusCode code_of(const Error& e) {
  switch (e.code) {
    case Errc::denied:
    case Errc::not_found:
    case Errc::unsupported:
      return StatusCode::failed_precondition;
    case Errc::invalid_argument:
    case Errc::parse:
      return StatusCode::invalid_argument;
    default:
      return StatusCode::internal;
  }
}

// An answer ttrpc could not carry (its data over kTtrpcMaxData: a huge adjustment) fails only
// that request; the connection stays up.
TtrpcMessage sendable(TtrpcMessage answer) {
  if (answer.data.size() <= kTtrpcMaxData) return answer;
  return error(answer.stream, StatusCode::internal,
               cat("gpufence-nri: the answer is ", answer.data.size(),
                   " bytes, above ttrpc's limit of ", kTtrpcMaxData, "; refused"));
}

TtrpcMessage answer_one(const TtrpcMessage& message, PluginHandler& handler);

}  // namespace

std::optional<NriVersion> parse_nri_version(std::string_view text) {
  if (text.starts_with('v')) text.remove_prefix(1);
  NriVersion v;
  int* parts[] = {&v.major, &v.minor, &v.patch};
  const char* p = text.data();
  const char* end = text.data() + text.size();
  for (size_t i = 0; i < 3; ++i) {
    auto [next, ec] = std::from_chars(p, end, *parts[i]);
    if (ec != std::errc() || *parts[i] < 0) return std::nullopt;
    p = next;
    if (i < 2) {
      if (p == end || *p != '.') return std::nullopt;
      ++p;
    }
  }
  if (v == NriVersion{}) return std::nullopt;  // "0.0.0-unknown"
  return v;
}

std::optional<NriVersion> infer_nri_version(std::string_view runtime_name,
                                            std::string_view runtime_version) {
  if (runtime_name != "containerd") return std::nullopt;
  auto c = parse_nri_version(runtime_version);
  if (!c) return std::nullopt;
  // nri@v0.12.0:pkg/api/version.go runtimeVersionMap.
  if (c->major == 1 && c->minor == 7) {
    if (c->patch <= 6) return NriVersion{0, 3, 0};
    if (c->patch <= 13) return NriVersion{0, 4, 0};
    if (c->patch <= 25) return NriVersion{0, 6, 1};
    return NriVersion{0, 8, 0};
  }
  if (c->major == 2 && c->minor <= 1) return NriVersion{0, 8, 0};
  if (c->major == 2 && c->minor == 2)
    return c->patch == 0 ? NriVersion{0, 10, 0} : NriVersion{0, 11, 0};
  if (c->major == 2 && c->minor >= 3) return NriVersion{0, 12, 0};
  return std::nullopt;
}

std::string RuntimeInfo::nri_text() const {
  if (!nri) return "unknown";
  return cat("v", nri->major, ".", nri->minor, ".", nri->patch);
}

RuntimeInfo runtime_info(const api::ConfigureRequest& request) {
  RuntimeInfo info;
  info.name = request.runtime_name();
  info.version = request.runtime_version();
  info.nri = parse_nri_version(request.nri_version());
  if (!info.nri) info.nri = infer_nri_version(info.name, info.version);
  // linux.resources.devices in an adjustment is collected and applied from v0.10.0 on
  // (nri@v0.10.0:pkg/adaptation/result.go, pkg/runtime-tools/generate/generate.go); an unknown
  // version is taken as one that ignores them.
  info.device_rules = info.nri && *info.nri >= NriVersion{0, 10, 0};
  if (request.request_timeout() > 0) info.request_timeout_ms = request.request_timeout();
  info.config = request.config();
  return info;
}

uint32_t subscribed_events() {
  return event_bit(api::CREATE_CONTAINER);
}

TtrpcMessage answer_request(const TtrpcMessage& message, PluginHandler& handler) {
  try {
    return sendable(answer_one(message, handler));
  } catch (const std::exception& e) {
    // A broken invariant or exhausted memory fails this request (closed: a creation fails), not
    // the session every later container needs.
    return error(message.stream, StatusCode::internal,
                 cat("gpufence-nri: internal error: ", e.what()));
  }
}

namespace {

TtrpcMessage answer_one(const TtrpcMessage& message, PluginHandler& handler) {
  const uint32_t stream = message.stream;
  ::ttrpc::Request request;
  if (!request.ParseFromString(message.data))
    return error(stream, StatusCode::invalid_argument, "malformed ttrpc request");
  if (request.service() != kPluginService)
    return error(stream, StatusCode::unimplemented, cat("service ", request.service()));
  const std::string& method = request.method();
  const std::string& payload = request.payload();

  if (method == "Configure") {
    api::ConfigureRequest in;
    if (!decode(payload, in)) return error(stream, StatusCode::invalid_argument, "Configure");
    if (auto st = handler.configured(runtime_info(in)); !st)
      return error(stream, StatusCode::failed_precondition, st.error().message);
    api::ConfigureResponse out;
    out.set_events(static_cast<int32_t>(handler.events()));
    return ok(stream, out);
  }
  if (method == "Synchronize") {
    api::SynchronizeRequest in;
    if (!decode(payload, in)) return error(stream, StatusCode::invalid_argument, "Synchronize");
    handler.synchronized(in);
    // A split synchronization (v0.8+) must be answered {more: true} chunk by chunk, with no
    // updates (nri@v0.12.0:pkg/adaptation/plugin.go synchronize).
    api::SynchronizeResponse out;
    out.set_more(in.more());
    return ok(stream, out);
  }
  if (method == "CreateContainer") {
    api::CreateContainerRequest in;
    if (!decode(payload, in))
      return error(stream, StatusCode::invalid_argument, "malformed CreateContainer request");
    const SteadyTime received =
        message.received == SteadyTime{} ? std::chrono::steady_clock::now() : message.received;
    auto adjustment = handler.create_container(in.pod(), in.container(), received);
    if (!adjustment) return error(stream, code_of(adjustment.error()), adjustment.error().message);
    api::CreateContainerResponse out;
    *out.mutable_adjust() = std::move(*adjustment);
    return ok(stream, out);
  }
  // Every other Plugin method: its response has only optional fields (Empty, or updates and
  // evictions we never ask for), so an empty payload is the "nothing to do" answer. Answering
  // Unimplemented to a v0.12 lifecycle rpc would switch the runtime to StateChange for this plugin
  // (nri@v0.12.0:pkg/adaptation/plugin_type.go wrapOrigImpl): these are answered, not refused.
  static constexpr std::string_view kKnown[] = {"Shutdown",
                                                "UpdateContainer",
                                                "StopContainer",
                                                "StateChange",
                                                "UpdatePodSandbox",
                                                "RunPodSandbox",
                                                "StopPodSandbox",
                                                "RemovePodSandbox",
                                                "PostUpdatePodSandbox",
                                                "PostCreateContainer",
                                                "StartContainer",
                                                "PostStartContainer",
                                                "PostUpdateContainer",
                                                "RemoveContainer"};
  for (std::string_view known : kKnown)
    if (method == known) return response_message(stream, StatusCode::ok, "", "");
  if (method == "ValidateContainerAdjustment") {
    api::ValidateContainerAdjustmentRequest in;
    if (!decode(payload, in))
      return error(stream, StatusCode::invalid_argument,
                   "malformed ValidateContainerAdjustment request");
    return ok(stream, handler.validate(in));
  }
  return error(stream, StatusCode::unimplemented, cat("method ", method));
}

}  // namespace

TtrpcMessage register_request(uint32_t stream, std::string_view name, std::string_view index) {
  api::RegisterPluginRequest payload;
  payload.set_plugin_name(std::string(name));
  payload.set_plugin_idx(std::string(index));
  payload.set_nri_version(std::string(kPluginNriVersion));
  ::ttrpc::Request request;
  request.set_service(std::string(kRuntimeService));
  request.set_method("RegisterPlugin");
  request.set_payload(payload.SerializeAsString());
  TtrpcMessage out{stream, static_cast<uint8_t>(TtrpcType::request), 0, {}};
  request.SerializeToString(&out.data);
  return out;
}

Status read_call_response(const TtrpcMessage& message) {
  if (message.type != static_cast<uint8_t>(TtrpcType::response))
    return fail(Errc::parse, "expected a ttrpc response, got type ", +message.type);
  ::ttrpc::Response response;
  if (!response.ParseFromString(message.data)) return fail(Errc::parse, "malformed ttrpc response");
  if (response.has_status() && response.status().code() != 0)
    return fail(Errc::rpc, "runtime answered code ", response.status().code(), ": ",
                response.status().message());
  return {};
}

}  // namespace gpufence::nri
