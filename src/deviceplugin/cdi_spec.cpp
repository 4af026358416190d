#include "deviceplugin/cdi_spec.hpp"

#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "common/file.hpp"
#include "deviceplugin/allocate.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

namespace {

void set_host_paths(std::vector<CdiDeviceNode>& nodes, const std::string& dev_root) {
  if (dev_root.empty() || dev_root == "/") return;
  for (auto& n : nodes) {
    if (n.host_path.empty()) n.host_path = host_device_path(dev_root, n.path);
  }
}

}  // namespace

std::filesystem::path plugin_cdi_spec_path(const PluginCdiSpecOptions& options) {
  return std::filesystem::path(options.dir) / options.file_name;
}

Result<CdiGenerateResult> build_plugin_cdi_spec(const HostFs& host, const std::vector<Gpu>& gpus,
                                                const PluginCdiSpecOptions& options) {
  CdiGenerateOptions gen;
  gen.kind = std::string(kCdiKind);
  gen.hook_path = options.hook_path;
  gen.driver_root = options.driver_root;
  gen.driver_files = DriverFiles::optional;
  const std::string driver_version = gpus.empty() ? "" : gpus.front().driver_version;
  auto result = generate_cdi_spec(host, gpus, driver_version, gen);
  if (!result) return std::unexpected(result.error().wrap("CDI spec"));
  CdiSpec& spec = result->spec;
  set_host_paths(spec.edits.device_nodes, options.dev_root);
  for (auto& d : spec.devices) set_host_paths(d.edits.device_nodes, options.dev_root);
  spec.cdi_version = minimum_cdi_version(spec);  // hostPath needs 0.5.0
  if (auto st = validate_cdi_spec(spec); !st)
    return std::unexpected(st.error().wrap("CDI spec with --dev-root " + options.dev_root));
  return result;
}

Result<SpecWrite> write_plugin_cdi_spec(const CdiSpec& spec, const PluginCdiSpecOptions& options) {
  if (options.dir.empty()) return fail(Errc::invalid_argument, "no CDI spec directory");
  if (options.file_name.find('/') != std::string::npos ||
      !(options.file_name.ends_with(".json") || options.file_name.ends_with(".yaml")))
    return fail(Errc::invalid_argument, "CDI spec file name '", options.file_name,
                "' must be a plain *.json or *.yaml name (the runtime reads no other)");
  const auto path = plugin_cdi_spec_path(options);
  const std::string content = options.file_name.ends_with(".json")
                                  ? cdi_spec_to_json(spec).dump(2) + "\n"
                                  : cdi_spec_to_yaml(spec);
  // Whatever a pod with a hostPath over the directory left at the name (a link, a FIFO) is not
  // read through; the rename below replaces it.
  if (auto old = read_regular_file(path); old && *old == content) return SpecWrite::unchanged;
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return fail(Errc::io, "create CDI spec directory ", options.dir, ": ", ec.message());
  // A new file is 0644 (it names no secret; every runtime reads it), a replaced one keeps its mode.
  if (auto st = write_file_atomic(path, content); !st)
    return std::unexpected(st.error().wrap("write CDI spec " + path.string()));
  return SpecWrite::written;
}

Result<bool> remove_legacy_plugin_cdi_spec(const PluginCdiSpecOptions& options) {
  if (options.dir.empty()) return false;
  const auto path = std::filesystem::path(options.dir) / kLegacyPluginCdiSpecFile;
  // unlink(2) removes the name: a link a pod planted there goes, its target stays.
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return fail_errno("remove the old CDI spec", path.string());
}

}  // namespace gpufence
