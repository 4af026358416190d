// The Container Device Interface spec (tags.cncf.io/container-device-interface specs-go, v1.1.0):
// model, reading (JSON or YAML), writing, validation, and the lowest cdiVersion a spec needs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace gpufence {

struct CdiDeviceNode {
  std::string path;
  std::string host_path;  // 0.5.0
  std::string type;       // "c", "b", "u", "p" or empty
  std::optional<long> major, minor;
  std::optional<unsigned> file_mode;
  std::string permissions;  // subset of "rwm"
  std::optional<unsigned> uid, gid;
};

struct CdiMount {
  std::string host_path;
  std::string container_path;
  std::vector<std::string> options;
  std::string type;  // 0.4.0
};

struct CdiHook {
  std::string
      hook_name;  // prestart, createRuntime, createContainer, startContainer, poststart, poststop
  std::string path;
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::optional<int> timeout;
};

struct CdiContainerEdits {
  std::vector<std::string> env;
  std::vector<CdiDeviceNode> device_nodes;
  std::vector<CdiMount> mounts;
  std::vector<CdiHook> hooks;
  bool empty() const {
    return env.empty() && device_nodes.empty() && mounts.empty() && hooks.empty();
  }
};

struct CdiDevice {
  std::string name;
  std::map<std::string, std::string> annotations;  // 0.6.0
  CdiContainerEdits edits;
};

struct CdiSpec {
  std::string cdi_version;
  std::string kind;                                // "vendor/class"
  std::map<std::string, std::string> annotations;  // 0.6.0
  std::vector<CdiDevice> devices;
  CdiContainerEdits edits;  // spec-wide, applied with any of its devices
};

inline const std::vector<std::string> kCdiVersions = {"0.3.0", "0.4.0", "0.5.0", "0.6.0",
                                                      "0.7.0", "0.8.0", "1.0.0", "1.1.0"};

// JSON or YAML text (YAML is a superset); `origin` names the file in errors. Unknown fields the
// CDI schema has (intelRdt, additionalGids, netDevices) are errors here: gpufence does not apply
// them, and a runtime must not silently drop what a spec asks for.
Result<CdiSpec> parse_cdi_spec(std::string_view text, std::string_view origin);

nlohmann::ordered_json cdi_spec_to_json(const CdiSpec& spec);
std::string cdi_spec_to_yaml(const CdiSpec& spec);

// Every rule of the CDI spec this model covers: version, kind and device names, unique devices,
// non-empty device edits, env form, absolute paths, node types and permissions, hook names, and
// that cdiVersion is at least minimum_cdi_version(). Errors name the field.
Status validate_cdi_spec(const CdiSpec& spec);
std::string minimum_cdi_version(const CdiSpec& spec);

}  // namespace gpufence
