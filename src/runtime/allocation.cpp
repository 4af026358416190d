#include "runtime/allocation.hpp"

#include "common/strings.hpp"

namespace gpufence {

std::string_view channel_name(Channel channel) {
  switch (channel) {
    case Channel::none:
      return "none";
    case Channel::cdi_annotations:
      return "cdi-annotations";
    case Channel::mount_markers:
      return "mount-markers";
    case Channel::envvar:
      return "envvar";
  }
  return "none";
}

namespace {

// Every nvidia.com/gpu name in the annotations under the trusted prefixes; other vendors' CDI
// devices are left for their own runtimes.
Result<std::vector<DeviceToken>> from_annotations(const Json& spec, const RuntimeConfig& cfg) {
  std::vector<DeviceToken> tokens;
  auto ann = spec.find("annotations");
  if (ann == spec.end() || !ann->is_object()) return tokens;
  for (const auto& [key, value] : ann->items()) {
    bool trusted = false;
    for (const auto& prefix : cfg.annotation_prefixes) trusted |= key.starts_with(prefix);
    if (!trusted || !value.is_string()) continue;
    for (std::string_view name : split(value.get_ref<const std::string&>(), ',')) {
      name = trim(name);
      if (!name.starts_with(std::string(kCdiKind) + "=")) continue;
      auto token = parse_device_token(name);
      if (!token) return std::unexpected(token.error().wrap("annotation " + key));
      tokens.push_back(std::move(*token));
    }
  }
  return tokens;
}

// /dev/null mounted at /var/run/nvidia-container-devices/<id>; <id> may also be a CDI name
// written as "cdi/nvidia.com/gpu=<id>".
Result<std::vector<DeviceToken>> from_mount_markers(const Json& spec) {
  std::vector<DeviceToken> tokens;
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array()) return tokens;
  const std::string root = std::string(kMountMarkerRoot) + "/";
  for (const auto& m : *mounts) {
    // Not an object, or source/destination not strings (runc refuses such a spec): no marker.
    // value() would throw on the latter (found by tests/fuzz/fuzz_oci_spec.cpp).
    if (!m.is_object() || !m.value("source", Json()).is_string() ||
        !m.value("destination", Json()).is_string())
      continue;
    std::string source = m.value("source", "");
    std::string dest = m.value("destination", "");
    if (source != "/dev/null" || !dest.starts_with(root)) continue;
    std::string_view id = std::string_view(dest).substr(root.size());
    if (id.starts_with("cdi/")) id.remove_prefix(4);
    if (id.starts_with("imex/")) continue;  // IMEX channels are not GPUs
    auto token = parse_device_token(id);
    if (!token) return std::unexpected(token.error().wrap("mount marker " + dest));
    tokens.push_back(std::move(*token));
  }
  return tokens;
}

}  // namespace

Result<AllocationRequest> find_allocation_request(const Json& spec, const RuntimeConfig& cfg,
                                                  bool privileged) {
  AllocationRequest req;
  if (cfg.trusts(TrustedChannel::cdi_annotations)) {
    auto tokens = from_annotations(spec, cfg);
    if (!tokens) return std::unexpected(tokens.error());
    if (!tokens->empty()) {
      req.channel = Channel::cdi_annotations;
      req.tokens = std::move(*tokens);
      return req;
    }
  }
  if (cfg.trusts(TrustedChannel::mount_markers)) {
    auto tokens = from_mount_markers(spec);
    if (!tokens) return std::unexpected(tokens.error());
    if (!tokens->empty()) {
      req.channel = Channel::mount_markers;
      req.tokens = std::move(*tokens);
      return req;
    }
  }
  auto env = get_env(spec, "NVIDIA_VISIBLE_DEVICES");
  if (!env) return req;
  bool env_trusted = cfg.trusts(TrustedChannel::envvar);
  if (!privileged && !env_trusted) {
    req.ignored = "NVIDIA_VISIBLE_DEVICES=" + *env + " (unprivileged container, env not trusted)";
    return req;
  }
  auto selector = parse_device_selector(*env);
  if (!selector) return std::unexpected(selector.error().wrap("NVIDIA_VISIBLE_DEVICES"));
  switch (selector->kind) {
    case DeviceSelector::Kind::all:
      if (!env_trusted) {
        req.ignored = "NVIDIA_VISIBLE_DEVICES=all (an image default, not an allocation)";
        return req;
      }
      req.channel = Channel::envvar;
      req.tokens.push_back(DeviceToken{DeviceToken::Kind::all, 0, "", "all"});
      return req;
    case DeviceSelector::Kind::list:
      for (const auto& t : selector->tokens) {
        if (t.kind == DeviceToken::Kind::all && !env_trusted) {
          req.ignored =
              "NVIDIA_VISIBLE_DEVICES=" + *env + " (all GPUs by env is not an allocation)";
          return req;
        }
      }
      req.channel = Channel::envvar;
      req.tokens = std::move(selector->tokens);
      return req;
    default:
      return req;  // unset, void, none, or the volume-mounts marker: no GPU from env
  }
}

}  // namespace gpufence
