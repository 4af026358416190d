#include "cdi/generate.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "cdi/hook_defaults.hpp"
#include "cdi/ldcache.hpp"
#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {
namespace {

// Libraries of the NVIDIA driver (not of the container toolkit).
bool is_driver_library(std::string_view name) {
  if (name.starts_with("libnvidia-container")) return false;
  return name.starts_with("libcuda.so") || name.starts_with("libcudadebugger.so") ||
         name.starts_with("libnvcuvid.so") || name.starts_with("libnvidia-") ||
         name.starts_with("libnvoptix.so");
}

// Libraries a DeepStream container cannot run without: CUDA, NVML, the JIT compilers, and the
// video decode/encode libraries.
const std::vector<std::string> kExpectedLibraries = {
    "libcuda.so",        "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so", "libnvcuvid.so",   "libnvidia-encode.so"};
const std::vector<std::string> kLibraryDirs = {"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                               "/usr/lib64", "/lib64", "/usr/lib"};
const std::vector<std::string> kUtilities = {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump"};

std::string join_root(const std::string& root, const std::string& path) {
  if (root.empty() || root == "/") return path;
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  return r + path;
}

// Follows symlinks inside the driver root (absolute targets are re-rooted there).
std::string resolve_in_root(const HostFs& fs, const std::string& path) {
  std::string current = path;
  for (int hop = 0; hop < 8; ++hop) {
    auto info = fs.stat(current);
    if (!info || info->type != FileType::symlink) return current;
    auto target = fs.read_link(current);
    if (!target) return current;
    if (target->starts_with("/"))
      current = *target;
    else
      current =
          (std::filesystem::path(current).parent_path() / *target).lexically_normal().string();
  }
  return current;
}

CdiMount ro_bind(const std::string& host_path, const std::string& container_path) {
  return {host_path, container_path, {"ro", "nosuid", "nodev", "bind"}, ""};
}

}  // namespace

Result<CdiGenerateResult> generate_cdi_spec(const HostFs& host, const std::vector<Gpu>& gpus,
                                            const std::string& driver_version,
                                            const CdiGenerateOptions& options) {
  if (!options.hook_path.starts_with("/"))
    return fail(Errc::invalid_argument, "hook path '", options.hook_path, "' must be absolute");
  CdiGenerateResult result;
  CdiSpec& spec = result.spec;
  spec.kind = options.kind;
  const std::string droot = options.driver_root;
  HostFs driver(host.resolve(droot));  // files of the driver, as this process sees them

  // Devices: by index, by UUID, and "all".
  CdiDevice all{"all", {}, {}};
  for (const auto& gpu : gpus) {
    auto node = host.stat(gpu.device_path());
    if (!node || node->type != FileType::char_device) {
      result.warnings.push_back(
          cat(gpu.device_path(), " (", gpu.uuid, ") is not present on the host"));
    }
    CdiDeviceNode dn{gpu.device_path(), "", "",           std::nullopt, std::nullopt,
                     std::nullopt,      "", std::nullopt, std::nullopt};
    CdiContainerEdits edits;
    edits.device_nodes.push_back(dn);
    spec.devices.push_back({std::to_string(gpu.index), {}, edits});
    spec.devices.push_back({gpu.uuid, {}, edits});
    all.edits.device_nodes.push_back(dn);
  }
  if (gpus.empty()) return fail(Errc::not_found, "no GPUs to describe");
  spec.devices.push_back(all);

  CdiContainerEdits& e = spec.edits;
  // The legacy NVIDIA hook must not inject devices again (NVIDIA container toolkit PR #395).
  e.env.push_back("NVIDIA_VISIBLE_DEVICES=void");
  for (const auto& control : kControlNodes) {
    std::string path(control.path);
    auto info = host.stat(path);
    if (info && info->type == FileType::char_device) {
      e.device_nodes.push_back(
          {path, "", "", std::nullopt, std::nullopt, std::nullopt, "", std::nullopt, std::nullopt});
    }
  }

  // Libraries: the driver root's linker cache, else the standard directories.
  std::vector<std::string> libs;
  if (auto cache = driver.read("/etc/ld.so.cache")) {
    auto entries = parse_ld_so_cache(*cache);
    if (!entries)
      return std::unexpected(entries.error().wrap(driver.resolve("/etc/ld.so.cache").string()));
    for (const auto& entry : *entries) {
      if (is_driver_library(entry.name) && driver.exists(entry.path)) libs.push_back(entry.path);
    }
  } else {
    result.warnings.push_back(cat("no ", join_root(droot, "/etc/ld.so.cache"),
                                  "; searched the standard library directories"));
    for (const auto& dir : kLibraryDirs) {
      auto names = driver.list(dir);
      if (!names) continue;
      for (const auto& name : *names) {
        if (is_driver_library(name) && name.find(".so") != std::string::npos)
          libs.push_back(dir + "/" + name);
      }
    }
  }
  std::sort(libs.begin(), libs.end());
  libs.erase(std::unique(libs.begin(), libs.end()), libs.end());
  if (libs.empty() && options.driver_files == DriverFiles::required)
    return fail(Errc::not_found, "no NVIDIA driver libraries found under ",
                host.resolve(droot).string());
  if (libs.empty()) {
    result.warnings.push_back(cat("no NVIDIA driver libraries found under ",
                                  host.resolve(droot).string(),
                                  "; the spec has device nodes only"));
  }
  for (const auto& want : kExpectedLibraries) {
    if (libs.empty()) break;
    bool found = std::any_of(libs.begin(), libs.end(), [&](const std::string& l) {
      return std::filesystem::path(l).filename().string().starts_with(want);
    });
    if (!found) result.warnings.push_back(cat("driver library ", want, "* not found"));
  }
  std::set<std::string> mounted, folders;
  for (const auto& lib : libs) {
    // Mount the file a name resolves to at that name, and at its own name too.
    std::string real = resolve_in_root(driver, lib);
    for (const auto& target : {lib, real}) {
      if (!mounted.insert(target).second) continue;
      e.mounts.push_back(ro_bind(join_root(droot, real), target));
      folders.insert(std::filesystem::path(target).parent_path().string());
    }
  }
  for (const auto& tool : kUtilities) {
    if (driver.exists(tool))
      e.mounts.push_back(ro_bind(join_root(droot, resolve_in_root(driver, tool)), tool));
    else
      result.warnings.push_back(cat("utility ", tool, " not found"));
  }
  // GSP firmware of this driver version (GSP-capable GPUs need it in the container).
  std::string fw_dir = "/lib/firmware/nvidia/" + driver_version;
  if (auto names = driver.list(fw_dir)) {
    for (const auto& name : *names) {
      if (name.starts_with("gsp"))
        e.mounts.push_back(ro_bind(join_root(droot, fw_dir + "/" + name), fw_dir + "/" + name));
    }
  }
  for (const std::string socket : {"/run/nvidia-persistenced/socket"}) {
    if (driver.exists(socket))
      e.mounts.push_back(
          {join_root(droot, socket), socket, {"ro", "nosuid", "nodev", "bind", "noexec"}, ""});
  }
  // Refresh the container's linker cache so the mounted libraries are found by name.
  // Explicit env and timeout: a hook without env runs with the container's environment
  // (hook_defaults.hpp), and not every runtime that reads this spec is gpufence.
  CdiHook hook{"createContainer",
               options.hook_path,
               {"gpufence-runtime", "hook", "update-ldcache"},
               kMinimalHookEnv,
               kDefaultHookTimeoutSeconds};
  for (const auto& f : folders) {
    hook.args.push_back("--folder");
    hook.args.push_back(f);
  }
  if (!folders.empty()) e.hooks.push_back(hook);

  spec.cdi_version = minimum_cdi_version(spec);
  if (auto st = validate_cdi_spec(spec); !st)
    return std::unexpected(st.error().wrap("generated spec is invalid"));
  return result;
}

}  // namespace gpufence
