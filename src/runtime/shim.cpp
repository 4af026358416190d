#include "runtime/shim.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/file.hpp"
#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "gpu/driver_procfs.hpp"
#include "runtime/cdi_edits.hpp"
#include "runtime/isolation.hpp"

namespace gpufence {
namespace {

// Every /dev/nvidia<N> on the host, by minor.
std::set<unsigned> host_gpu_minors(const HostFs& host) {
  std::set<unsigned> minors;
  auto names = host.list("/dev");
  if (!names) return minors;
  for (const auto& name : *names) {
    if (auto minor = gpu_node_minor("/dev/" + name)) minors.insert(*minor);
  }
  return minors;
}

Result<DeviceNode> host_char_device(const HostFs& host, const std::string& path) {
  auto info = host.stat(path);
  if (!info) return std::unexpected(info.error());
  if (info->type != FileType::char_device) {
    return fail(Errc::not_found, host.resolve(path).native(), " is not a character device");
  }
  return DeviceNode{path, info->major, info->minor};
}

}  // namespace

Result<ShimDecision> prepare_bundle(const RuncInvocation& inv, ShimContext& ctx) {
  ShimDecision decision;
  decision.container_id = inv.container_id;
  const auto spec_path = std::filesystem::path(inv.bundle) / "config.json";

  // Read and parse the spec; any problem stops creation before runc sees it.
  auto text = read_file(spec_path);
  if (!text) return std::unexpected(text.error());
  Json spec;
  try {
    spec = Json::parse(*text);
  } catch (const Json::parse_error& e) {
    return fail(Errc::parse, "malformed ", spec_path.native(), ": ", e.what());
  }
  if (!spec.is_object())
    return fail(Errc::parse, "malformed ", spec_path.native(), ": not a JSON object");

  // Which GPUs were allocated, from trusted channels only.
  decision.privileged = is_privileged(spec);
  auto request = find_allocation_request(spec, ctx.config, decision.privileged);
  if (!request) return std::unexpected(request.error());
  decision.channel = request->channel;
  if (!request->ignored.empty()) {
    ctx.log.info("runtime.ignored", {{"container", inv.container_id}, {"what", request->ignored}});
  }
  if (request->tokens.empty() && decision.privileged &&
      ctx.config.privileged_policy == PrivilegedPolicy::passthrough) {
    decision.passthrough = true;
    return decision;
  }

  // Resolve against the host's GPUs. UUIDs (what gpufence-device-plugin sends) resolve from the
  // driver's procfs, which is cheap; indices need NVML's numbering. Privileged containers need
  // the full list to deny what they were not given. An unprivileged container that asked for
  // nothing needs neither, which keeps the common non-GPU create fast.
  HostFs host(ctx.config.device_root);
  std::vector<Gpu> inventory;
  if (!request->tokens.empty() || decision.privileged) {
    bool uuids_only =
        std::all_of(request->tokens.begin(), request->tokens.end(),
                    [](const DeviceToken& t) { return t.kind != DeviceToken::Kind::index; });
    bool have_inventory = false;
    if (uuids_only) {
      if (auto gpus = read_driver_gpus(host)) {
        inventory = std::move(*gpus);
        have_inventory = true;
        decision.inventory_source = "driver-procfs";
      } else if (gpus.error().code != Errc::not_found) {
        ctx.log.warn("runtime.driver_procfs_unreadable", {{"error", gpus.error().message}});
      }
    }
    if (!have_inventory) {
      auto inv_or = ctx.open_inventory();
      auto gpus =
          inv_or ? (*inv_or)->gpus() : Result<std::vector<Gpu>>(std::unexpected(inv_or.error()));
      if (gpus) {
        inventory = std::move(*gpus);
        decision.inventory_source = "nvml";
      } else if (!request->tokens.empty()) {
        return std::unexpected(gpus.error().wrap("GPUs were requested but"));
      } else {
        ctx.log.warn("runtime.nvml_unavailable",
                     {{"container", inv.container_id},
                      {"error", gpus.error().message},
                      {"fallback", "deny every /dev/nvidiaN on the host"}});
      }
    }
  }
  std::vector<Gpu> granted;
  for (const auto& token : request->tokens) {
    auto gpus = resolve_token(token, inventory);
    if (!gpus)
      return std::unexpected(gpus.error().wrap(std::string(channel_name(request->channel))));
    for (auto& g : *gpus) {
      if (std::none_of(granted.begin(), granted.end(),
                       [&](const Gpu& x) { return x.uuid == g.uuid; })) {
        granted.push_back(std::move(g));
      }
    }
  }

  // CDI: when the allocation names CDI devices and specs for nvidia.com/gpu exist, apply their
  // edits (driver libraries, utilities, env, hooks). Isolation below still decides GPU nodes.
  std::vector<DeviceNode> cdi_nodes;
  std::vector<std::string> cdi_names;
  const std::string cdi_prefix = std::string(kCdiKind) + "=";
  for (const auto& token : request->tokens) {
    if (token.text.starts_with(cdi_prefix))
      cdi_names.push_back(token.text.substr(cdi_prefix.size()));
  }
  if (!cdi_names.empty()) {
    auto specs = load_cdi_specs(ctx.config.cdi_spec_dirs, kCdiKind);
    if (!specs) return std::unexpected(specs.error());
    if (specs->empty()) {
      ctx.log.debug("runtime.no_cdi_spec", {{"container", inv.container_id},
                                            {"dirs", join(ctx.config.cdi_spec_dirs, ",")}});
    } else {
      auto applied = apply_cdi_devices(spec, *specs, cdi_names, host);
      if (!applied) return std::unexpected(applied.error());
      for (const auto& node : applied->nodes) {
        if (auto minor = gpu_node_minor(node.path)) {
          bool granted_minor = std::any_of(granted.begin(), granted.end(),
                                           [&](const Gpu& g) { return g.minor == *minor; });
          if (!granted_minor) {
            return fail(Errc::denied, "CDI spec gives ", node.path, " for ",
                        join(applied->from, ", "),
                        ", which is not the GPU this host knows by that name");
          }
          continue;
        }
        cdi_nodes.push_back(node);
      }
      decision.cdi_devices = applied->from;
    }
  }

  // Plan: the granted nodes (as the host has them), the control nodes present, and every other
  // GPU minor to deny.
  IsolationPlan plan;
  for (const auto& gpu : granted) {
    auto node = host_char_device(host, gpu.device_path());
    if (!node) return std::unexpected(node.error().wrap("device node of " + gpu.uuid));
    plan.grant.push_back(*node);
    plan.uuids.push_back(gpu.uuid);
    decision.granted.push_back(gpu.uuid);
  }
  if (!granted.empty()) {
    for (const auto& path : ctx.config.control_nodes) {
      if (auto node = host_char_device(host, path)) plan.grant.push_back(*node);
    }
  }
  for (const auto& node : cdi_nodes) {
    if (std::none_of(plan.grant.begin(), plan.grant.end(),
                     [&](const DeviceNode& d) { return d.path == node.path; })) {
      plan.grant.push_back(node);
    }
  }
  plan.deny_minors = host_gpu_minors(host);
  for (const auto& gpu : inventory) plan.deny_minors.insert(gpu.minor);
  for (const auto& gpu : granted) plan.deny_minors.erase(gpu.minor);
  plan.explicit_none =
      get_env(spec, "NVIDIA_VISIBLE_DEVICES") == std::optional<std::string>("none");

  auto result = isolate_spec(spec, plan);
  if (!result) return std::unexpected(result.error().wrap(spec_path.native()));
  decision.denied_minors.assign(plan.deny_minors.begin(), plan.deny_minors.end());

  // The driver's GPU list: a createContainer hook narrows it to the granted GPUs' entries.
  if ((!granted.empty() || decision.privileged) && host.exists(ctx.config.procfs_gpus_dir)) {
    std::vector<std::string> args = {"gpufence-runtime", "hook", "driver-procfs", "--dir",
                                     ctx.config.procfs_gpus_dir};
    for (const auto& gpu : granted) {
      args.push_back("--keep");
      args.push_back(driver_gpu_entry_name(gpu.pci_bus_id));
    }
    char self[4096];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return fail_errno("readlink", "/proc/self/exe");
    Json hook = Json::object();
    hook["path"] = std::string(self, static_cast<size_t>(n));
    hook["args"] = args;
    ensure_array(ensure_object(spec, "hooks"), "createContainer").push_back(hook);
    result->changed = true;
  }
  decision.spec_changed = result->changed;

  // Write only when something changed: an untouched spec stays byte-for-byte identical.
  if (result->changed) {
    std::string out;
    try {
      out = spec.dump();
    } catch (const Json::exception& e) {
      return fail(Errc::parse, "cannot serialise edited ", spec_path.native(), ": ", e.what());
    }
    if (auto st = write_file_atomic(spec_path, out); !st) return std::unexpected(st.error());
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
  std::error_code ec1, ec2;
  auto target = std::filesystem::canonical(path, ec1);
  auto self = std::filesystem::canonical("/proc/self/exe", ec2);
  if (!ec1 && !ec2 && target == self) {
    return fail(Errc::invalid_argument, "low-level runtime ", path,
                " is gpufence-runtime itself; set [runtime] low_level to runc");
  }
  return path;
}

}  // namespace gpufence
