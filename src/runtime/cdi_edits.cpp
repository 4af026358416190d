#include "runtime/cdi_edits.hpp"

#include <algorithm>
#include <limits>
#include <set>

#include "cdi/hook_defaults.hpp"
#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/host_devices.hpp"

namespace gpufence {
namespace {

Result<CdiSpecSet> load_set(const std::vector<std::string>& dirs,
                            const std::vector<std::string_view>& kinds) {
  // The shim sees the host at "/"; config paths are host paths.
  return load_cdi_spec_dirs(HostFs("/"), dirs, kinds);
}

}  // namespace

Result<std::vector<CdiSpecFile>> load_cdi_specs(const std::vector<std::string>& dirs,
                                                const std::vector<std::string_view>& kinds) {
  auto set = load_set(dirs, kinds);
  if (!set) return std::unexpected(set.error());
  apply_cdi_priority(set->specs);
  return std::move(set->specs);
}

Result<std::vector<CdiSpecFile>> load_cdi_specs(const std::vector<std::string>& dirs,
                                                const std::vector<std::string_view>& kinds,
                                                Logger& log) {
  auto set = load_set(dirs, kinds);
  if (!set) return std::unexpected(set.error());
  for (const auto& s : set->skipped) {
    if (s.why == CdiSkip::other_kind)
      log.debug("runtime.cdi_spec_other_kind", {{"file", s.path}, {"kind", s.detail}});
    else
      log.warn("runtime.cdi_spec_skipped", {{"file", s.path}, {"error", s.detail}});
  }
  for (const auto& dup : apply_cdi_priority(set->specs)) {
    log.info("runtime.cdi_device_overridden", {{"device", dup.name},
                                               {"used", join(dup.winners, ",")},
                                               {"ignored", join(dup.ignored, ",")}});
  }
  return std::move(set->specs);
}

namespace {

// upstream ContainerEdits.Apply: "" means rwm, "none" means no access.
std::string cgroup_access(const CdiDeviceNode& n) {
  if (n.permissions.empty()) return "rwm";
  if (n.permissions == "none") return "";
  return n.permissions;
}

// upstream fillMissingInfo: a node without major/minor takes the host node's (hostPath, else
// path); the facts hold that node's numbers, read before this step.
std::string node_host_path(const CdiDeviceNode& n) {
  return n.host_path.empty() ? n.path : n.host_path;
}

bool needs_host_numbers(const CdiDeviceNode& n) {
  return !n.major || !n.minor;
}

Result<DeviceNode> resolve_node(const CdiDeviceNode& n, const HostDeviceFacts& facts) {
  if (!needs_host_numbers(n)) {
    constexpr long long kMax = std::numeric_limits<unsigned>::max();
    if (*n.major > kMax || *n.minor > kMax)
      return fail(Errc::parse, "major ", *n.major, " or minor ", *n.minor, " is out of range");
    return DeviceNode{n.path, static_cast<unsigned>(*n.major), static_cast<unsigned>(*n.minor)};
  }
  return facts.char_device(node_host_path(n), n.path);
}

// Whether the mount was added (a destination the spec already has is left as it is).
bool add_mount(Json& oci, const CdiMount& m) {
  Json& mounts = ensure_array(oci, "mounts");
  for (const auto& existing : mounts) {
    if (existing.is_object() && existing.value("destination", "") == m.container_path) return false;
  }
  Json entry = Json::object();
  entry["destination"] = m.container_path;
  entry["type"] = m.type.empty() ? "bind" : m.type;
  entry["source"] = m.host_path;
  entry["options"] =
      m.options.empty() ? std::vector<std::string>{"ro", "nosuid", "nodev", "bind"} : m.options;
  mounts.push_back(entry);
  return true;
}

// A hook without env would run with the container's environment, one without timeout could
// hold the create forever (hook_defaults.hpp): give each what the spec left out.
void add_hook(Json& oci, const CdiHook& h) {
  Json entry = Json::object();
  entry["path"] = h.path;
  if (!h.args.empty()) entry["args"] = h.args;
  entry["env"] = h.env.empty() ? kMinimalHookEnv : h.env;
  entry["timeout"] = h.timeout.value_or(kDefaultHookTimeoutSeconds);
  Json& list = ensure_array(ensure_object(oci, "hooks"), h.hook_name.c_str());
  // containerd 1.7+ with CDI enabled may have injected this spec already: the same hook (path
  // and args) is not added twice, so ldconfig does not run twice per start.
  bool present = std::any_of(list.begin(), list.end(), [&](const Json& existing) {
    return existing.is_object() && existing.value("path", "") == h.path &&
           existing.value("args", Json::array()) == entry.value("args", Json::array());
  });
  if (!present) list.push_back(entry);
}

// upstream: AddProcessAdditionalGID for each, skipping 0; each gid once.
void add_gids(Json& oci, const std::vector<std::uint32_t>& gids) {
  if (gids.empty()) return;
  Json& list = ensure_array(ensure_object(ensure_object(oci, "process"), "user"), "additionalGids");
  for (auto gid : gids) {
    if (gid == 0) continue;
    if (std::none_of(list.begin(), list.end(), [&](const Json& g) {
          return g.is_number() && g.get<long long>() == static_cast<long long>(gid);
        })) {
      list.push_back(gid);
    }
  }
}

Status apply_edits(Json& oci, const CdiContainerEdits& e, const HostDeviceFacts& facts,
                   CdiApplied& applied, const std::string& where) {
  // intelRdt sets the container's cache allocation class and netDevices moves host interfaces
  // into it: neither belongs in a GPU spec, and runc 1.1 would drop netDevices silently. Refuse
  // rather than run a container without what its spec asks for.
  if (e.intel_rdt) return fail(Errc::unsupported, where, ": intelRdt is not applied by gpufence");
  if (!e.net_devices.empty())
    return fail(Errc::unsupported, where, ": netDevices is not applied by gpufence");
  for (const auto& env : e.env) {
    auto eq = env.find('=');
    set_env(oci, env.substr(0, eq), env.substr(eq + 1));
  }
  for (const auto& n : e.device_nodes) {
    auto node = resolve_node(n, facts);
    if (!node) return std::unexpected(node.error().wrap(where + ": device node " + n.path));
    std::string access = cgroup_access(n);
    applied.access[node->path] = access;
    if (access.empty()) continue;  // "none": never granted
    if (std::none_of(applied.nodes.begin(), applied.nodes.end(),
                     [&](const DeviceNode& d) { return d.path == node->path; })) {
      applied.nodes.push_back(*node);
    }
  }
  for (const auto& m : e.mounts)
    if (add_mount(oci, m)) applied.mounts.push_back(m.container_path + "<-" + m.host_path);
  for (const auto& h : e.hooks) add_hook(oci, h);
  add_gids(oci, e.additional_gids);
  return {};
}

}  // namespace

Result<CdiSelection> select_cdi_devices(const std::vector<CdiSpecFile>& specs,
                                        const std::vector<std::string>& names) {
  CdiSelection selection;
  std::vector<const CdiSpecFile*> used;  // in the order first needed
  std::vector<std::pair<const CdiSpecFile*, const CdiDevice*>> devices;
  for (const auto& qualified : names) {
    auto cdi = split_cdi_name(qualified);
    if (!cdi) return fail(Errc::invalid_argument, "CDI device '", qualified, "' names no kind");
    const CdiSpecFile* owner = nullptr;
    const CdiDevice* device = nullptr;
    for (const auto& file : specs) {
      if (file.spec.kind != cdi->kind) continue;
      for (const auto& d : file.spec.devices) {
        if (d.name != cdi->name) continue;
        if (owner) {
          // Upstream drops such a device as unresolvable; say which files to reconcile.
          return fail(Errc::denied, "CDI device ", qualified, " is defined by both ", owner->path,
                      " and ", file.path, " (one directory holds both: remove one)");
        }
        owner = &file;
        device = &d;
      }
    }
    if (!owner) {
      std::vector<std::string> paths;
      for (const auto& f : specs)
        if (f.spec.kind == cdi->kind) paths.push_back(f.path);
      return fail(Errc::not_found, "unknown CDI device ", qualified, " (not in ",
                  paths.empty() ? cat("any ", cdi->kind, " spec") : join(paths, ", "), ")");
    }
    if (std::find(used.begin(), used.end(), owner) == used.end()) used.push_back(owner);
    devices.emplace_back(owner, device);
    selection.from.push_back(cat(qualified, " (", owner->path, ")"));
  }
  // Spec-wide edits once per spec used, then each device's (upstream InjectDevices).
  for (const auto* file : used) selection.edits.push_back({file->spec.edits, file->path});
  for (const auto& [file, device] : devices)
    selection.edits.push_back({device->edits, cat(file->path, ": device ", device->name)});
  return selection;
}

HostDeviceQuery host_device_query(const CdiSelection& selection) {
  HostDeviceQuery query;
  for (const auto& step : selection.edits) {
    for (const auto& n : step.edits.device_nodes) {
      if (needs_host_numbers(n)) query.char_paths.insert(node_host_path(n));
      // Any node may be a DRM node: it is judged against the host's list (shim.cpp).
      if (needs_host_numbers(n) || *n.major == kDrmMajor) query.drm_nodes = true;
    }
  }
  return query;
}

Result<std::vector<unsigned>> gpu_minors_of_selection(const CdiSelection& selection,
                                                      const HostDeviceFacts& facts) {
  std::vector<unsigned> minors;
  for (const auto& step : selection.edits) {
    for (const auto& n : step.edits.device_nodes) {
      // A block, FIFO or unbuffered node is never a GPU; an untyped one is typed by the host.
      if (!n.type.empty() && n.type != "c") continue;
      auto node = resolve_node(n, facts);
      if (!node) return std::unexpected(node.error().wrap(step.where));
      if (node->major != kNvidiaMajor || node->minor > kNvidiaMaxGpuMinor) continue;
      if (std::find(minors.begin(), minors.end(), node->minor) == minors.end())
        minors.push_back(node->minor);
    }
  }
  return minors;
}

Result<CdiApplied> apply_cdi_selection(Json& oci, const CdiSelection& selection,
                                       const HostDeviceFacts& facts) {
  CdiApplied applied;
  applied.from = selection.from;
  for (const auto& step : selection.edits) {
    if (auto st = apply_edits(oci, step.edits, facts, applied, step.where); !st)
      return std::unexpected(st.error());
  }
  return applied;
}

Result<CdiApplied> apply_cdi_devices(Json& oci, const std::vector<CdiSpecFile>& specs,
                                     const std::vector<std::string>& names, const HostFs& host) {
  auto selection = select_cdi_devices(specs, names);
  if (!selection) return std::unexpected(selection.error());
  return apply_cdi_selection(oci, *selection,
                             read_host_device_facts(host, host_device_query(*selection)));
}

}  // namespace gpufence
