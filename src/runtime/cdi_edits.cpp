#include "runtime/cdi_edits.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "common/file.hpp"
#include "common/strings.hpp"

namespace gpufence {

Result<std::vector<CdiSpecFile>> load_cdi_specs(const std::vector<std::string>& dirs,
                                                std::string_view kind) {
  std::vector<CdiSpecFile> out;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      auto ext = entry.path().extension().string();
      if (ext == ".yaml" || ext == ".yml" || ext == ".json") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      auto text = read_file(file);
      if (!text) return std::unexpected(text.error().wrap("CDI spec"));
      auto spec = parse_cdi_spec(*text, file);
      if (!spec) return std::unexpected(spec.error().wrap("malformed CDI spec"));
      if (spec->kind == kind) out.push_back({file, std::move(*spec)});
    }
  }
  return out;
}

namespace {

Result<DeviceNode> resolve_node(const CdiDeviceNode& n, const HostFs& host) {
  if (n.major && n.minor)
    return DeviceNode{n.path, static_cast<unsigned>(*n.major), static_cast<unsigned>(*n.minor)};
  // hostPath is a host path as the spec writes it; without one the node sits at the same path.
  std::string source = n.host_path.empty() ? n.path : n.host_path;
  auto info = host.stat(source);
  if (!info) return std::unexpected(info.error());
  if (info->type != FileType::char_device) {
    return fail(Errc::not_found, host.resolve(source).native(), " is not a character device");
  }
  return DeviceNode{n.path, info->major, info->minor};
}

void add_mount(Json& oci, const CdiMount& m) {
  Json& mounts = ensure_array(oci, "mounts");
  for (const auto& existing : mounts) {
    if (existing.is_object() && existing.value("destination", "") == m.container_path) return;
  }
  Json entry = Json::object();
  entry["destination"] = m.container_path;
  entry["type"] = m.type.empty() ? "bind" : m.type;
  entry["source"] = m.host_path;
  entry["options"] =
      m.options.empty() ? std::vector<std::string>{"ro", "nosuid", "nodev", "bind"} : m.options;
  mounts.push_back(entry);
}

void add_hook(Json& oci, const CdiHook& h) {
  Json entry = Json::object();
  entry["path"] = h.path;
  if (!h.args.empty()) entry["args"] = h.args;
  if (!h.env.empty()) entry["env"] = h.env;
  if (h.timeout) entry["timeout"] = *h.timeout;
  ensure_array(ensure_object(oci, "hooks"), h.hook_name.c_str()).push_back(entry);
}

Status apply_edits(Json& oci, const CdiContainerEdits& e, const HostFs& host, CdiApplied& applied,
                   const std::string& where) {
  for (const auto& env : e.env) {
    auto eq = env.find('=');
    set_env(oci, env.substr(0, eq), env.substr(eq + 1));
  }
  for (const auto& n : e.device_nodes) {
    auto node = resolve_node(n, host);
    if (!node) return std::unexpected(node.error().wrap(where + ": device node " + n.path));
    if (std::none_of(applied.nodes.begin(), applied.nodes.end(),
                     [&](const DeviceNode& d) { return d.path == node->path; })) {
      applied.nodes.push_back(*node);
    }
  }
  for (const auto& m : e.mounts) add_mount(oci, m);
  for (const auto& h : e.hooks) add_hook(oci, h);
  return {};
}

}  // namespace

Result<CdiApplied> apply_cdi_devices(Json& oci, const std::vector<CdiSpecFile>& specs,
                                     const std::vector<std::string>& names, const HostFs& host) {
  CdiApplied applied;
  std::set<const CdiSpecFile*> used;
  std::vector<std::pair<const CdiSpecFile*, const CdiDevice*>> devices;
  for (const auto& name : names) {
    const CdiSpecFile* owner = nullptr;
    const CdiDevice* device = nullptr;
    for (const auto& file : specs) {
      for (const auto& d : file.spec.devices) {
        if (d.name != name) continue;
        if (owner) {
          return fail(Errc::denied, "CDI device nvidia.com/gpu=", name, " is defined by both ",
                      owner->path, " and ", file.path);
        }
        owner = &file;
        device = &d;
      }
    }
    if (!owner) {
      std::vector<std::string> paths;
      for (const auto& f : specs) paths.push_back(f.path);
      return fail(Errc::not_found, "unknown CDI device nvidia.com/gpu=", name, " (not in ",
                  join(paths, ", "), ")");
    }
    used.insert(owner);
    devices.emplace_back(owner, device);
    applied.from.push_back(cat("nvidia.com/gpu=", name, " (", owner->path, ")"));
  }
  // Spec-wide edits once per spec used, then each device's.
  for (const auto* file : used) {
    if (auto st = apply_edits(oci, file->spec.edits, host, applied, file->path); !st)
      return std::unexpected(st.error());
  }
  for (const auto& [file, device] : devices) {
    if (auto st = apply_edits(oci, device->edits, host, applied, file->path); !st)
      return std::unexpected(st.error());
  }
  return applied;
}

}  // namespace gpufence
