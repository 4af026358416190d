// The Container Device Interface spec (tags.cncf.io/container-device-interface specs-go, v1.1.0):
// model, reading (JSON or YAML), writing, validation, and the lowest cdiVersion a spec needs.
// Every rule here is the CDI project's own, cited rule by rule in docs/cdi.md.
#pragma once

#include <cstdint>
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
  std::optional<long long> major, minor;
  std::optional<std::uint32_t> file_mode;
  std::string permissions;  // letters of "rwm", "none" (no cgroup access) or empty ("rwm")
  std::optional<std::uint32_t> uid, gid;
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

// 0.7.0 (schemata and enableMonitoring 1.1.0; enableCMT and enableMBM only before 1.1.0).
struct CdiIntelRdt {
  std::string clos_id;
  std::string l3_cache_schema;
  std::string mem_bw_schema;
  std::optional<std::vector<std::string>> schemata;
  bool enable_cmt = false;
  bool enable_mbm = false;
  bool enable_monitoring = false;
};

// 1.1.0: a host network interface moved into the container's network namespace.
struct CdiNetDevice {
  std::string host_interface_name;
  std::string name;
};

struct CdiContainerEdits {
  std::vector<std::string> env;
  std::vector<CdiDeviceNode> device_nodes;
  std::vector<CdiMount> mounts;
  std::vector<CdiHook> hooks;
  std::vector<std::uint32_t> additional_gids;  // 0.7.0
  std::optional<CdiIntelRdt> intel_rdt;        // 0.7.0
  std::vector<CdiNetDevice> net_devices;       // 1.1.0
  bool empty() const {
    return env.empty() && device_nodes.empty() && mounts.empty() && hooks.empty() &&
           additional_gids.empty() && !intel_rdt && net_devices.empty();
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

// Every version the CDI project has released, oldest first. 0.1.0 and 0.2.0 are known versions,
// but every spec needs at least 0.3.0 (upstream's vEarliest), so they are never valid.
inline const std::vector<std::string> kCdiVersions = {"0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0",
                                                      "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"};

// Reading is two steps so a reader can look at `kind` before judging the rest of a file:
// syntax (JSON, else YAML; errors carry line and column), then the typed decode.
using CdiDocument = nlohmann::ordered_json;
Result<CdiDocument> parse_cdi_document(std::string_view text, std::string_view origin);
// The document's `kind` when it is a string; nullopt otherwise.
std::optional<std::string> cdi_document_kind(const CdiDocument& doc);
// Typed decode of every field of the CDI schema, then validate_cdi_spec(). A field the schema
// does not have is an error (upstream reads with yaml.UnmarshalStrict); a field of the wrong type
// is an error naming it ("devices[0].containerEdits.deviceNodes[1].major must be an integer").
Result<CdiSpec> decode_cdi_spec(const CdiDocument& doc, std::string_view origin);
// parse_cdi_document + decode_cdi_spec.
Result<CdiSpec> parse_cdi_spec(std::string_view text, std::string_view origin);

nlohmann::ordered_json cdi_spec_to_json(const CdiSpec& spec);
std::string cdi_spec_to_yaml(const CdiSpec& spec);

// The CDI project's rules (pkg/cdi, api/producer validator, pkg/parser, specs-go version.go):
// known cdiVersion at least minimum_cdi_version(), vendor/class/device name syntax, annotation
// keys, unique devices, non-empty device edits, KEY=VALUE env (edits and hooks), device node
// type, numbers and permissions, hook names, mounts with both paths, intelRdt closID, netDevices.
// Plus what OCI requires of the config.json the edits end up in: absolute container paths and
// hook paths (docs/cdi.md says where gpufence is stricter than upstream and why).
Status validate_cdi_spec(const CdiSpec& spec);
// The lowest cdiVersion that has every feature the spec uses, computed as upstream does.
std::string minimum_cdi_version(const CdiSpec& spec);

// Name rules of pkg/parser.
bool valid_cdi_vendor(std::string_view vendor);
bool valid_cdi_class(std::string_view cls);
bool valid_cdi_device_name(std::string_view name);

}  // namespace gpufence
