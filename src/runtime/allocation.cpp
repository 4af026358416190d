#include "runtime/allocation.hpp"

#include <algorithm>

#include "common/escape.hpp"
#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

bool AllocationChannels::needs_indices() const {
  auto by_index = [](const DeviceToken& t) { return t.kind == DeviceToken::Kind::index; };
  return std::any_of(annotations.begin(), annotations.end(), by_index) ||
         std::any_of(markers.begin(), markers.end(), by_index) ||
         std::any_of(env.begin(), env.end(), by_index);
}

namespace {

// Every GPU CDI name (kGpuCdiKinds: the plugin's own, and NVIDIA's in an answer an older plugin
// gave) in the annotations under the trusted prefixes; other vendors' CDI devices are left for
// their own runtimes.
Status read_annotations(const Json& spec, const RuntimeConfig& cfg, AllocationChannels& out) {
  auto ann = spec.find("annotations");
  if (ann == spec.end() || !ann->is_object()) return {};
  for (const auto& [key, value] : ann->items()) {
    bool trusted = std::any_of(cfg.annotation_prefixes.begin(), cfg.annotation_prefixes.end(),
                               [&](const std::string& p) { return key.starts_with(p); });
    if (!trusted) continue;
    for (std::string_view name : split(value.get_ref<const std::string&>(), ',')) {
      name = trim(name);
      auto cdi = split_cdi_name(name);
      if (cdi && cfg.is_listed_gpu_kind(cdi->kind)) {
        if (cdi->name.empty())
          return fail(Errc::invalid_argument, "annotation ", key, ": CDI name ",
                      escape_excerpt(name), " names no device");
        if (std::find(out.listed_cdi.begin(), out.listed_cdi.end(), name) == out.listed_cdi.end())
          out.listed_cdi.emplace_back(name);
        continue;
      }
      if (!cdi || !is_gpu_cdi_kind(cdi->kind)) continue;
      auto token = parse_device_token(name);
      if (!token) return std::unexpected(token.error().wrap("annotation " + key));
      out.annotations.push_back(std::move(*token));
    }
  }
  return {};
}

// /dev/nvidiaN entries (char 195:N, N a GPU minor) of linux.devices.
void read_device_specs(const Json& spec, AllocationChannels& out) {
  auto lin = spec.find("linux");
  if (lin == spec.end() || !lin->is_object()) return;
  auto devices = lin->find("devices");
  if (devices == lin->end() || !devices->is_array()) return;
  for (const auto& d : *devices) {
    if (d.value("type", "") != "c" || !d.contains("major") || !d.contains("minor")) continue;
    if (d["major"].get<unsigned>() != kNvidiaMajor) continue;
    unsigned minor = d["minor"].get<unsigned>();
    if (minor > kNvidiaMaxGpuMinor) continue;  // nvidiactl, nvidia-modeset
    if (std::find(out.device_minors.begin(), out.device_minors.end(), minor) ==
        out.device_minors.end())
      out.device_minors.push_back(minor);
  }
}

// /dev/null mounted at /var/run/nvidia-container-devices/<id>; <id> may also be a CDI name
// written as "cdi/<kind>=<id>" (kGpuCdiKinds). Read leniently: a pod can write these.
void read_markers(const Json& spec, AllocationChannels& out) {
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array()) return;
  const std::string root = std::string(kMountMarkerRoot) + "/";
  for (const auto& m : *mounts) {
    std::string dest = m.value("destination", "");
    if (m.value("source", "") != "/dev/null" || !dest.starts_with(root)) continue;
    std::string_view id = std::string_view(dest).substr(root.size());
    if (id.starts_with("cdi/")) id.remove_prefix(4);
    if (id.starts_with("imex/")) continue;  // IMEX channels are not GPUs
    auto token = parse_device_token(id);
    if (!token) {
      out.ignored.push_back(
          cat("mount marker ", escape_excerpt(dest), " (", token.error().message, ")"));
      continue;
    }
    out.markers.push_back(std::move(*token));
  }
}

// Every value of `key` in process.env, in order.
std::vector<std::string> env_values(const Json& spec, std::string_view key) {
  std::vector<std::string> out;
  auto proc = spec.find("process");
  if (proc == spec.end() || !proc->is_object()) return out;
  auto env = proc->find("env");
  if (env == proc->end() || !env->is_array()) return out;
  const std::string prefix = std::string(key) + "=";
  for (const auto& e : *env) {
    if (e.is_string() && e.get_ref<const std::string&>().starts_with(prefix))
      out.push_back(e.get_ref<const std::string&>().substr(prefix.size()));
  }
  return out;
}

Status read_env(const Json& spec, const RuntimeConfig& cfg, AllocationChannels& out) {
  auto env = get_env(spec, "NVIDIA_VISIBLE_DEVICES");
  if (!env) return {};
  bool trusted = cfg.trusts(Channel::envvar);
  if (trusted) {
    // containerd appends the image's env, then the container config's: the kubelet puts the
    // device plugin's envs there first and the pod's own after them (kubelet_pods.go
    // GenerateRunContainerOptions). containerd keeps every entry (oci.WithEnv,
    // replaceOrAppendEnvValues) and the process sees the last. So a pod's own value after the
    // plugin's is an override that, with envvar trusted, would name its GPU. The image's "all"
    // (every CUDA base image) comes before the plugin's value and is no override; any other
    // disagreement, or "all" after a named value, is.
    auto values = env_values(spec, "NVIDIA_VISIBLE_DEVICES");
    std::vector<std::string> named;
    for (const auto& v : values)
      if (v != "all") named.push_back(v);
    auto other = std::find_if(named.begin(), named.end(),
                              [&](const std::string& v) { return v != named.front(); });
    bool all_last = !named.empty() && values.back() == "all";
    if (other != named.end() || all_last) {
      const std::string& second = all_last ? values.back() : *other;
      return fail(Errc::denied, "NVIDIA_VISIBLE_DEVICES is set ", values.size(),
                  " times with values that disagree (\"",
                  escape_excerpt(named.front(), kExcerptBytes, "\""), "\", then \"",
                  escape_excerpt(second, kExcerptBytes, "\""),
                  "\"): the pod's env overrides the device plugin's, and with trusted_channels "
                  "\"envvar\" that would choose the GPU; remove NVIDIA_VISIBLE_DEVICES from the "
                  "pod's env (docs/trust-model.md)");
    }
  }
  auto selector = parse_device_selector(*env);
  if (!selector) {
    if (!trusted) {
      out.ignored.push_back(
          cat("NVIDIA_VISIBLE_DEVICES=", escape_excerpt(*env), " (not an allocation)"));
      return {};
    }
    return std::unexpected(selector.error().wrap("NVIDIA_VISIBLE_DEVICES"));
  }
  switch (selector->kind) {
    case DeviceSelector::Kind::none:
      out.env_none = true;
      return {};
    case DeviceSelector::Kind::all:
    case DeviceSelector::Kind::list:
      if (!trusted) {
        out.ignored.push_back(cat("NVIDIA_VISIBLE_DEVICES=", escape_excerpt(*env),
                                  " (the pod's own env, not an allocation)"));
        return {};
      }
      if (selector->kind == DeviceSelector::Kind::all)
        out.env.push_back(DeviceToken{DeviceToken::Kind::all, 0, "", "all", ""});
      else
        out.env = std::move(selector->tokens);
      return {};
    default:
      return {};  // unset, void, or the volume-mounts marker: no GPU from env
  }
}

void add_unique(std::vector<Gpu>& out, const Gpu& g) {
  if (std::none_of(out.begin(), out.end(), [&](const Gpu& x) { return x.uuid == g.uuid; }))
    out.push_back(g);
}

Result<std::vector<Gpu>> resolve_all(const std::vector<DeviceToken>& tokens,
                                     const std::vector<Gpu>& inventory, std::string_view channel) {
  std::vector<Gpu> out;
  for (const auto& t : tokens) {
    auto gpus = resolve_token(t, inventory);
    if (!gpus) return std::unexpected(gpus.error().wrap(std::string(channel)));
    for (const auto& g : *gpus) add_unique(out, g);
  }
  return out;
}

std::vector<std::string> uuids_of(const std::vector<Gpu>& gpus) {
  std::vector<std::string> out;
  for (const auto& g : gpus) out.push_back(g.uuid);
  return out;
}

// What the refusal of disagreeing channels tells the operator: the likely cause and the remedy.
constexpr std::string_view kRenumberedAdvice =
    ". If the node rebooted and the GPUs' minor numbers changed, the kubelet replayed this "
    "container's checkpointed Allocate answer (device-plugins/kubelet_internal_checkpoint) with "
    "the old minors: delete the pod so that it is admitted afresh (its controller recreates it "
    "with a new UID). gpufence refuses rather than grant a GPU other than the one allocated "
    "(docs/trust-model.md, \"Renumbered GPUs\")";

std::string minors_of(const std::vector<unsigned>& minors) {
  std::string out = " (";
  for (size_t i = 0; i < minors.size(); ++i)
    out += (i ? ", " : "") + std::string("/dev/nvidia") + std::to_string(minors[i]);
  return out + " now)";
}

bool same_gpus(const std::vector<Gpu>& a, const std::vector<Gpu>& b) {
  auto ua = uuids_of(a), ub = uuids_of(b);
  std::sort(ua.begin(), ua.end());
  std::sort(ub.begin(), ub.end());
  return ua == ub;
}

}  // namespace

Result<AllocationChannels> read_allocation_channels(const Json& spec, const RuntimeConfig& cfg,
                                                    bool admits_all_devices) {
  AllocationChannels out;
  out.admits_all_devices = admits_all_devices;
  if (auto st = check_spec_fields(spec); !st) return std::unexpected(st.error());
  if (cfg.trusts(Channel::cdi_annotations)) {
    if (auto st = read_annotations(spec, cfg, out); !st) return std::unexpected(st.error());
  }
  if (!admits_all_devices) read_device_specs(spec, out);
  if (cfg.trusts(Channel::mount_markers)) read_markers(spec, out);
  if (auto st = read_env(spec, cfg, out); !st) return std::unexpected(st.error());
  return out;
}

Result<Allocation> decide_allocation(const AllocationChannels& ch,
                                     const std::vector<Gpu>& inventory) {
  Allocation out;
  out.ignored = ch.ignored;
  auto from_annotations = resolve_all(ch.annotations, inventory, "CDI annotation");
  if (!from_annotations) return std::unexpected(from_annotations.error());
  for (unsigned minor : ch.listed_cdi_minors) {
    auto it = std::find_if(inventory.begin(), inventory.end(),
                           [&](const Gpu& g) { return g.minor == minor; });
    if (it == inventory.end())
      return fail(Errc::not_found, "CDI device ", escape_excerpt(join(ch.listed_cdi, ",")),
                  " gives /dev/nvidia", minor, " (195:", minor,
                  "), which names no GPU of this node");
    add_unique(*from_annotations, *it);
  }
  std::vector<Gpu> from_devices;
  for (unsigned minor : ch.device_minors) {
    auto it = std::find_if(inventory.begin(), inventory.end(),
                           [&](const Gpu& g) { return g.minor == minor; });
    if (it == inventory.end())
      return fail(Errc::not_found, "device spec /dev/nvidia", minor, " (195:", minor,
                  ") names no GPU of this node");
    add_unique(from_devices, *it);
  }
  if (!from_annotations->empty() && !from_devices.empty() &&
      !same_gpus(*from_annotations, from_devices)) {
    return fail(Errc::denied, "the kubelet's channels disagree: CDI annotations name ",
                join(uuids_of(*from_annotations), ","), " but the device specs name ",
                join(uuids_of(from_devices), ","), minors_of(ch.device_minors), kRenumberedAdvice);
  }
  // Device specs name GPUs by minor number, markers by UUID (or index): after a reboot that
  // renumbered the GPUs the kubelet replays its checkpointed answer, and the minors name other
  // GPUs than the UUIDs. A marker the device specs do not cover is refused, not ignored, so the
  // minors alone never grant a GPU the allocation did not name. A pod that forges a marker beside
  // its own device spec only refuses itself.
  if (from_annotations->empty() && !from_devices.empty()) {
    for (const auto& t : ch.markers) {
      auto gpus = resolve_token(t, inventory);
      if (!gpus) continue;  // names no GPU of this node: ignored below, as before
      for (const auto& g : *gpus) {
        if (std::none_of(from_devices.begin(), from_devices.end(),
                         [&](const Gpu& d) { return d.uuid == g.uuid; }))
          return fail(Errc::denied, "the kubelet's channels disagree: a mount marker names ",
                      g.uuid, " but the device specs name ", join(uuids_of(from_devices), ","),
                      minors_of(ch.device_minors), kRenumberedAdvice);
      }
    }
  }
  const std::vector<Gpu>& base = from_annotations->empty() ? from_devices : *from_annotations;
  if (!base.empty()) {
    out.channel = from_annotations->empty() ? Channel::device_specs : Channel::cdi_annotations;
    out.granted = base;
    for (const auto& t : ch.markers) {
      auto gpus = resolve_token(t, inventory);
      bool corroborated = gpus && std::all_of(gpus->begin(), gpus->end(), [&](const Gpu& g) {
                            return std::any_of(base.begin(), base.end(),
                                               [&](const Gpu& b) { return b.uuid == g.uuid; });
                          });
      if (!corroborated)
        out.ignored.push_back("mount marker " + t.text + " (no kubelet channel names that GPU)");
    }
    return out;
  }
  if (!ch.markers.empty()) {
    if (!ch.admits_all_devices) {
      for (const auto& t : ch.markers)
        out.ignored.push_back("mount marker " + t.text +
                              " (unprivileged container without the kubelet's device specs)");
    } else {
      auto gpus = resolve_all(ch.markers, inventory, "mount marker");
      if (!gpus) return std::unexpected(gpus.error());
      out.channel = Channel::mount_markers;
      out.granted = std::move(*gpus);
      return out;
    }
  }
  if (!ch.env.empty()) {
    auto gpus = resolve_all(ch.env, inventory, "NVIDIA_VISIBLE_DEVICES");
    if (!gpus) return std::unexpected(gpus.error());
    out.channel = Channel::envvar;
    out.granted = std::move(*gpus);
  }
  return out;
}

}  // namespace gpufence
