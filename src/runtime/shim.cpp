#include "runtime/shim.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "cdi/hook_defaults.hpp"
#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "gpu/driver_procfs.hpp"
#include "gpu/nvml_inventory.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/cdi_edits.hpp"
#include "runtime/device_rules.hpp"
#include "runtime/host_devices.hpp"
#include "runtime/mount_guard.hpp"
#include "runtime/mount_table.hpp"

namespace gpufence {
namespace {

// NVIDIA_DRIVER_CAPABILITIES: unset or empty means NVIDIA's default "utility,compute".
bool wants_capability(const Json& spec, std::string_view capability) {
  if (capability.empty()) return true;
  std::string caps = get_env(spec, "NVIDIA_DRIVER_CAPABILITIES").value_or("");
  if (trim(caps).empty()) caps = "utility,compute";
  for (std::string_view c : split(caps, ',')) {
    c = trim(c);
    if (c == "all" || c == capability || (capability == "display" && c == "graphics")) return true;
  }
  return false;
}

std::string_view control_node_capability(std::string_view path) {
  for (const auto& n : kControlNodes)
    if (n.path == path) return n.capability;
  return "";
}

constexpr size_t kMaxSpecDepth = 64;

// The deepest [ or { nesting of JSON text, strings skipped.
size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

bool spec_mentions_drm(const Json& spec) {
  auto lin = spec.find("linux");
  if (lin == spec.end() || !lin->is_object()) return false;
  if (auto devices = lin->find("devices"); devices != lin->end() && devices->is_array()) {
    for (const auto& d : *devices)
      if (d.value("type", "") == "c" && d.contains("major") && d["major"] == kDrmMajor) return true;
  }
  auto rules = parse_spec_device_rules(spec);
  return rules && std::any_of(rules->begin(), rules->end(), [](const DeviceRule& r) {
           return r.allow && (!r.major || *r.major == kDrmMajor);
         });
}

// A CDI spec is judged by what its nodes are, not what they are called: a node of NVIDIA's GPU
// major (195:0..253) under any path ("/dev/gpu-alias", "/dev/./nvidia1") must be a granted GPU's,
// and an NVIDIA GPU's DRM node (226:N) must belong to a granted GPU (by PCI bus id).
Status refuse_foreign_gpu_nodes(const std::vector<DeviceNode>& nodes,
                                const std::vector<Gpu>& granted, const HostDeviceFacts& facts,
                                const std::vector<std::string>& from) {
  for (const auto& node : nodes) {
    std::string what;
    if (node.major == kNvidiaMajor && node.minor <= kNvidiaMaxGpuMinor) {
      bool ok = std::any_of(granted.begin(), granted.end(),
                            [&](const Gpu& g) { return g.minor == node.minor; });
      if (!ok) what = cat("the device of GPU minor ", node.minor);
    } else if (node.major == kDrmMajor) {
      // Only a DRM node the host lists, of another vendor or of a granted GPU: an unknown minor
      // (or one whose vendor sysfs does not say) is not granted on trust.
      const auto& drm = facts.drm_nodes;
      auto d = std::find_if(drm.begin(), drm.end(),
                            [&](const DrmNode& x) { return x.minor == node.minor; });
      if (d == drm.end()) {
        what = cat("a DRM node this host does not list");
      } else if (d->nvidia && std::none_of(granted.begin(), granted.end(), [&](const Gpu& g) {
                   return driver_gpu_entry_name(g.pci_bus_id) == d->pci_bus_id;
                 })) {
        what = cat("the DRM node ", d->name, " of the NVIDIA GPU at ", d->pci_bus_id);
      }
    }
    if (!what.empty())
      return fail(Errc::denied, "CDI spec gives ", escape_excerpt(node.path), " (char ", node.major,
                  ":", node.minor, ", ", what, ") for ", join(from, ", "),
                  ", which is not a GPU allocated to this container");
  }
  return {};
}

// CDI, step one: when the allocation came as CDI names and specs of their kinds exist, the edits
// those names select (driver libraries, utilities, env, hooks). Only the kinds named are read: a
// malformed spec of a kind this container does not use must not refuse it.
Result<CdiSelection> select_cdi(const AllocationChannels& channels, const Allocation& allocation,
                                ShimContext& ctx, const ShimDecision& decision) {
  if (ctx.cdi_edits != CdiEdits::apply || allocation.channel != Channel::cdi_annotations)
    return CdiSelection{};
  std::vector<std::string> names;
  std::vector<std::string_view> kinds;
  for (const auto& t : channels.annotations) {
    if (t.cdi_kind.empty()) continue;
    names.push_back(t.text);
    for (auto kind : kGpuCdiKinds)
      if (kind == t.cdi_kind && std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
        kinds.push_back(kind);
  }
  if (names.empty()) return CdiSelection{};
  auto specs = load_cdi_specs(ctx.config.cdi_spec_dirs, kinds, ctx.log);
  if (!specs) return std::unexpected(specs.error());
  if (specs->empty()) {
    ctx.log.debug("runtime.no_cdi_spec", {{"container", decision.container_id},
                                          {"dirs", join(ctx.config.cdi_spec_dirs, ",")}});
    return CdiSelection{};
  }
  return select_cdi_devices(*specs, names);
}

// CDI, step two: apply the selected edits. Isolation still decides the GPU nodes: a GPU node the
// spec adds must be one of the granted GPUs. Returns the nodes isolation must add besides the
// granted GPUs' own.
Result<std::vector<DeviceNode>> apply_cdi(Json& spec, const CdiSelection& selection,
                                          const Allocation& allocation,
                                          const HostDeviceFacts& facts, ShimDecision& decision) {
  std::vector<DeviceNode> extra;
  if (selection.edits.empty()) return extra;
  auto applied = apply_cdi_selection(spec, selection, facts);
  if (!applied) return std::unexpected(applied.error());
  if (auto st = refuse_foreign_gpu_nodes(applied->nodes, allocation.granted, facts, applied->from);
      !st)
    return std::unexpected(st.error());
  for (const auto& node : applied->nodes) {
    // A granted GPU's own /dev/nvidiaN is planned from the host; any other node (an alias of a
    // granted GPU included) is added as the spec names it.
    bool own_gpu_path = gpu_node_minor(node.path) == std::optional<unsigned>(node.minor) &&
                        node.major == kNvidiaMajor;
    if (!own_gpu_path) extra.push_back(node);
  }
  decision.cdi_devices = applied->from;
  decision.cdi_mounts = applied->mounts;
  return extra;
}

HostDeviceFacts read_host_devices(const HostDeviceQuery& query, const ShimContext& ctx) {
  if (ctx.read_host_devices) return ctx.read_host_devices(query);
  return read_host_device_facts(HostFs(ctx.config.device_root), query);
}

// The GPUs that CDI names of a listed kind ([cdi] gpu_kinds: another DRA driver's, named per
// claim) stand for: the GPU nodes their specs give, by device number. Fails closed: a name no
// spec defines, or a node the host lacks, refuses the container (the runtime's own injection
// would fail on it too).
Status resolve_listed_cdi_kinds(AllocationChannels& channels, ShimContext& ctx) {
  if (channels.listed_cdi.empty()) return {};
  std::vector<std::string_view> kinds;
  for (const auto& name : channels.listed_cdi) {
    auto kind = split_cdi_name(name)->kind;
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  auto specs = load_cdi_specs(ctx.config.cdi_spec_dirs, kinds, ctx.log);
  if (!specs) return std::unexpected(specs.error());
  auto selection = select_cdi_devices(*specs, channels.listed_cdi);
  if (!selection) return std::unexpected(selection.error());
  auto minors =
      gpu_minors_of_selection(*selection, read_host_devices(host_device_query(*selection), ctx));
  if (!minors) return std::unexpected(minors.error());
  channels.listed_cdi_minors = std::move(*minors);
  return {};
}

}  // namespace

InventoryFactory host_nvml_inventory(std::string nvml_library) {
  return [library = std::move(nvml_library)]() -> Result<std::unique_ptr<GpuInventory>> {
    auto nvml = NvmlInventory::open(nvml_library_path(library), HostFs("/"));
    if (!nvml) return std::unexpected(nvml.error());
    return std::unique_ptr<GpuInventory>(std::move(*nvml));
  };
}

Status refuse_cgroupfs_binds_on_host(const Json& spec, CgroupMountPoints* kept) {
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array() || mounts->empty()) return {};
  // This process's own mount table: gpufence-runtime runs in the host's (containerd's) namespace.
  auto points = kept ? kept->get() : read_cgroup_mount_points();
  if (!points) return std::unexpected(points.error().wrap("cannot check bind mounts"));
  return refuse_cgroupfs_binds(spec, *points, [](const std::string& p) {
    char buf[PATH_MAX];
    return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
  });
}

Result<Json> parse_spec(std::string_view text, std::string_view where) {
  // The JSON parser recurses per level: bound the nesting before it runs out of stack. An OCI
  // spec is a handful of levels deep.
  if (json_nesting_depth(text) > kMaxSpecDepth)
    return fail(Errc::parse, "malformed ", where, ": nested deeper than ", kMaxSpecDepth,
                " levels");
  Json spec;
  try {
    spec = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number overflow
    return fail(Errc::parse, "malformed ", where, ": ", e.what());
  }
  if (auto st = check_spec_fields(spec); !st)
    return std::unexpected(st.error().wrap(cat("malformed ", where)));
  if (auto rules = parse_spec_device_rules(spec); !rules)
    return std::unexpected(rules.error().wrap(cat("malformed ", where)));
  return spec;
}

Result<Json> read_spec(const std::filesystem::path& spec_path) {
  auto text = read_file(spec_path);
  if (!text) return std::unexpected(text.error());
  return parse_spec(*text, spec_path.native());
}

Result<std::vector<Gpu>> load_inventory(const AllocationChannels& channels, const HostFs& host,
                                        ShimContext& ctx, std::string& source) {
  if (channels.empty()) return std::vector<Gpu>{};
  if (!channels.needs_indices()) {
    if (auto gpus = read_driver_gpus(host)) {
      source = "driver-procfs";
      return gpus;
    } else if (gpus.error().code != Errc::not_found) {
      ctx.log.warn("runtime.driver_procfs_unreadable", {{"error", gpus.error().message}});
    }
  }
  auto inv = ctx.open_inventory();
  if (!inv) return std::unexpected(inv.error().wrap("GPUs were requested but"));
  auto gpus = (*inv)->gpus();
  if (!gpus) return std::unexpected(gpus.error().wrap("GPUs were requested but"));
  source = "nvml";
  return gpus;
}

HostDeviceQuery host_device_query(const Json& spec, const std::vector<Gpu>& granted,
                                  const RuntimeConfig& cfg) {
  HostDeviceQuery query;
  for (const auto& gpu : granted) query.char_paths.insert(gpu.device_path());
  // Every control node, whatever NVIDIA_DRIVER_CAPABILITIES says now: a CDI spec's env may change
  // it before the plan reads it.
  if (!granted.empty()) query.char_paths.insert(cfg.control_nodes.begin(), cfg.control_nodes.end());
  query.drm_nodes = admits_all_devices(spec) || spec_mentions_drm(spec);
  return query;
}

Result<IsolationPlan> plan_isolation(const Json& spec, const std::vector<Gpu>& granted,
                                     const std::vector<DeviceNode>& extra_nodes,
                                     const HostDeviceFacts& facts, const RuntimeConfig& cfg) {
  IsolationPlan plan;
  // NVIDIA's fixed majors are reserved even when /proc/devices cannot be read (wire_contract).
  plan.reserved_majors = {kNvidiaMajor, kDrmMajor};
  // The granted GPUs' nodes as the host has them, then their control nodes.
  for (const auto& gpu : granted) {
    auto node = facts.char_device(gpu.device_path(), gpu.device_path());
    if (!node) return std::unexpected(node.error().wrap("device node of " + gpu.uuid));
    plan.grant.push_back(*node);
    plan.uuids.push_back(gpu.uuid);
  }
  if (!granted.empty()) {
    for (const auto& path : cfg.control_nodes) {
      if (!wants_capability(spec, control_node_capability(path))) continue;
      if (auto node = facts.char_device(path, path)) plan.grant.push_back(*node);
    }
  }
  for (const auto& node : extra_nodes) {
    if (std::none_of(plan.grant.begin(), plan.grant.end(),
                     [&](const DeviceNode& d) { return d.path == node.path; }))
      plan.grant.push_back(node);
  }
  // Registered majors: which are NVIDIA's (never wildcard-allowed), and every major a whitelist
  // must list when the spec admitted devices by wildcard. Without them a privileged spec cannot
  // be narrowed safely, so that is an error; a default-deny spec only loses the dynamic majors.
  bool admits_all = admits_all_devices(spec);
  if (const auto& devices = facts.registered) {
    plan.reserved_majors = nvidia_reserved_majors(*devices);
    for (const auto& m : devices->character) plan.host_majors.character.push_back(m.major);
    for (const auto& m : devices->block) plan.host_majors.block.push_back(m.major);
  } else if (admits_all) {
    return std::unexpected(devices.error().wrap(
        "cannot rewrite a privileged spec's device rules without the host's device majors"));
  }
  // DRM nodes: keep those of other vendors and of the granted GPUs; the rest are NVIDIA GPUs
  // this container was not given (or unknown, and so denied).
  if (admits_all || spec_mentions_drm(spec)) {
    std::set<std::string> granted_bus;
    for (const auto& g : granted) granted_bus.insert(driver_gpu_entry_name(g.pci_bus_id));
    for (const auto& drm : facts.drm_nodes) {
      if (!drm.nvidia || granted_bus.contains(drm.pci_bus_id))
        plan.keep.emplace(kDrmMajor, drm.minor);
    }
  }
  plan.explicit_none =
      get_env(spec, "NVIDIA_VISIBLE_DEVICES") == std::optional<std::string>("none");
  return plan;
}

Json driver_procfs_hook(const std::string& self_exe, const std::string& procfs_dir,
                        const std::vector<Gpu>& granted) {
  std::vector<std::string> args = {"gpufence-runtime", "hook", "driver-procfs", "--dir",
                                   procfs_dir};
  for (const auto& gpu : granted) {
    args.push_back("--keep");
    args.push_back(driver_gpu_entry_name(gpu.pci_bus_id));
  }
  Json hook = Json::object();
  hook["path"] = self_exe;
  hook["args"] = args;
  hook["env"] = Json(kMinimalHookEnv);
  hook["timeout"] = kDefaultHookTimeoutSeconds;
  return hook;
}

Json cgroup_mounts_hook(const std::string& self_exe) {
  Json hook = Json::object();
  hook["path"] = self_exe;
  hook["args"] = {"gpufence-runtime", "hook", "cgroup-mounts"};
  hook["env"] = Json(kMinimalHookEnv);
  hook["timeout"] = kDefaultHookTimeoutSeconds;
  return hook;
}

bool pin_hook_environments(Json& spec) {
  auto hooks = spec.find("hooks");
  if (hooks == spec.end() || !hooks->is_object()) return false;
  bool changed = false;
  for (auto& [name, list] : hooks->items()) {
    if (!list.is_array()) continue;
    for (auto& hook : list) {
      if (!hook.is_object()) continue;
      if (!hook.contains("env") || hook["env"].is_null()) {
        hook["env"] = Json(kMinimalHookEnv);
        changed = true;
      }
      if (!hook.contains("timeout") || hook["timeout"].is_null()) {
        hook["timeout"] = kDefaultHookTimeoutSeconds;
        changed = true;
      }
    }
  }
  return changed;
}

Status write_spec(const std::filesystem::path& spec_path, const Json& spec) {
  std::string out;
  try {
    out = spec.dump();
  } catch (const Json::exception& e) {
    return fail(Errc::parse, "cannot serialise edited ", spec_path.native(), ": ", e.what());
  }
  return write_file_atomic(spec_path, out);
}

Result<bool> edit_spec(Json& spec, ShimContext& ctx, ShimDecision& decision,
                       std::string_view where) {
  const HostFs host(ctx.config.device_root);

  // 2. What each allocation channel says; only the kubelet's count.
  decision.admits_all_devices = admits_all_devices(spec);
  auto channels = read_allocation_channels(spec, ctx.config, decision.admits_all_devices);
  if (!channels) return std::unexpected(channels.error());
  if (channels->empty() && decision.admits_all_devices &&
      ctx.config.all_devices_policy == AllDevicesPolicy::passthrough) {
    decision.passthrough = true;
    return false;
  }

  // 2b. CDI names of a listed kind (another DRA driver's) stand for the GPU nodes their specs
  //     give.
  if (auto st = resolve_listed_cdi_kinds(*channels, ctx); !st) return std::unexpected(st.error());

  // 3. Resolve against the node's GPUs and decide.
  auto inventory = load_inventory(*channels, host, ctx, decision.inventory_source);
  if (!inventory) return std::unexpected(inventory.error());
  auto allocation = decide_allocation(*channels, *inventory);
  if (!allocation) return std::unexpected(allocation.error());
  decision.channel = allocation->channel;
  decision.ignored = allocation->ignored;
  for (const auto& g : allocation->granted) decision.granted.push_back(g.uuid);

  // 4. CDI: the edits the CDI-named devices select, unless the runtime already injected them
  //    (containerd's CRI does, before NRI sees the spec).
  auto cdi = select_cdi(*channels, *allocation, ctx, decision);
  if (!cdi) return std::unexpected(cdi.error());

  // 5. The host's device facts this decision needs, read once; every later step judges by them.
  HostDeviceQuery query = host_device_query(spec, allocation->granted, ctx.config);
  HostDeviceQuery cdi_query = host_device_query(*cdi);
  query.char_paths.merge(cdi_query.char_paths);
  query.drm_nodes |= cdi_query.drm_nodes;
  const HostDeviceFacts facts = read_host_devices(query, ctx);

  // 6. Apply the CDI edits (driver files, env, hooks); a node of another GPU is refused.
  auto extra = apply_cdi(spec, *cdi, *allocation, facts, decision);
  if (!extra) return std::unexpected(extra.error());

  // 7. No bind mount, the pod's or a CDI spec's, may hand an unprivileged container a cgroup
  //    filesystem (a privileged one has the whole host anyway: docs/trust-model.md). This is
  //    the early, clear refusal; the cgroup-mounts hook (10) judges what was really mounted.
  //     Nothing the host mounts later may reach it either: no bind receives host mounts.
  bool propagation_pinned = false;
  if (!decision.admits_all_devices) {
    if (auto st = refuse_cgroupfs_binds_on_host(spec, ctx.cgroup_mounts); !st)
      return std::unexpected(st.error());
    auto pinned = pin_private_propagation(spec);
    if (!pinned) return std::unexpected(pinned.error());
    propagation_pinned = *pinned;
  }

  // 8. Plan and apply the isolation: nodes, device cgroup rules, cgroupfs, env.
  auto plan = plan_isolation(spec, allocation->granted, *extra, facts, ctx.config);
  if (!plan) return std::unexpected(plan.error());
  for (const auto& n : plan->grant)
    decision.granted_nodes.push_back(cat(n.path, "=c", n.major, ":", n.minor));
  auto result = isolate_spec(spec, *plan);
  if (!result) return std::unexpected(result.error().wrap(where));
  decision.removed_nodes = result->removed_nodes;
  decision.whitelisted = result->whitelisted;
  bool changed = result->changed || propagation_pinned;

  // 9. The driver's GPU list: a createContainer hook narrows it to the granted GPUs' entries.
  if ((!allocation->granted.empty() || decision.admits_all_devices) &&
      host.exists(ctx.config.procfs_gpus_dir)) {
    ensure_array(ensure_object(spec, "hooks"), "createContainer")
        .push_back(
            driver_procfs_hook(ctx.self_exe, ctx.config.procfs_gpus_dir, allocation->granted));
    changed = true;
  }

  // 10. The last createContainer hook checks the container's own mount table after runc made
  //    every mount: a volume's source swapped after 7 cannot slip a cgroup filesystem in.
  if (!decision.admits_all_devices && may_mount_a_cgroupfs(spec)) {
    ensure_array(ensure_object(spec, "hooks"), "createContainer")
        .push_back(cgroup_mounts_hook(ctx.self_exe));
    changed = true;
  }

  // 11. No hook runs with the container's environment or without a time limit.
  changed |= pin_hook_environments(spec);
  decision.spec_changed = changed;
  return changed;
}

Result<ShimDecision> prepare_bundle(const RuncInvocation& inv, ShimContext& ctx) {
  ShimDecision decision;
  decision.container_id = inv.container_id;
  const auto spec_path = std::filesystem::path(inv.bundle) / "config.json";

  // 1. Read the spec and check the type of every field we read: nothing runs on a guess.
  auto spec = read_spec(spec_path);
  if (!spec) return std::unexpected(spec.error());

  // 2-11. The decision and the edit, shared with gpufence-nri.
  auto changed = edit_spec(*spec, ctx, decision, spec_path.native());
  if (!changed) return std::unexpected(changed.error());

  // 12. Write only when something changed: an untouched spec stays byte-for-byte identical.
  if (*changed) {
    if (auto st = write_spec(spec_path, *spec); !st) return std::unexpected(st.error());
  }
  return decision;
}

Result<std::string> resolve_low_level_runtime(const std::string& configured) {
  std::string path;
  if (configured.find('/') != std::string::npos) {
    path = configured;
  } else {
    const char* env_path = std::getenv("PATH");
    std::string search = env_path && *env_path
                             ? env_path
                             : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (std::string_view dir : split(search, ':')) {
      if (dir.empty()) continue;
      std::string candidate = std::string(dir) + "/" + configured;
      if (::access(candidate.c_str(), X_OK) == 0) {
        path = candidate;
        break;
      }
    }
    if (path.empty())
      return fail(Errc::not_found, "low-level runtime '", configured, "' not found on PATH");
  }
  if (::access(path.c_str(), X_OK) != 0) return fail_errno("low-level runtime", path);
  // The same file as ourselves (by device and inode: two stats, on every container command)?
  struct stat target {
  }, self{};
  if (::stat(path.c_str(), &target) == 0 && ::stat("/proc/self/exe", &self) == 0 &&
      target.st_dev == self.st_dev && target.st_ino == self.st_ino) {
    return fail(Errc::invalid_argument, "low-level runtime ", path,
                " is gpufence-runtime itself; set [runtime] low_level to runc");
  }
  return path;
}

}  // namespace gpufence
