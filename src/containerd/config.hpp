// containerd's configuration as the CRI plugin reads it: versions 1 to 4, their CRI tables,
// imports, and the runtime handlers a RuntimeClass can name.
//
// Facts (containerd 1.6.20 measured here; nvidia-container-toolkit engine/containerd):
// - CRI plugin table by version: 1 "cri", 2 "io.containerd.grpc.v1.cri", 3 and 4
//   "io.containerd.cri.v1.runtime"; runtimes live under <cri>.containerd.runtimes.<name>.
//   Version 4 (containerd 2.3) differs from 3 only outside the CRI plugin (the server's grpc,
//   ttrpc, debug and metrics settings moved into plugins: serviceMigrate in
//   cmd/containerd/server/config/config.go, v2.3.4).
// - containerd 2.x refuses a drop-in whose version is higher than the root file's ("drop-in
//   config version %d higher than root config version %d", LoadConfigWithPlugins) and migrates
//   a lower one: a drop-in is written in the root file's version.
// - containerd 1.x merges an imported file by *replacing* each top-level plugin section it
//   defines: a drop-in holding only runtimes.nvidia wipes the main file's CRI settings (runc
//   runtime, sandbox image) — seen with `containerd config dump`. So version 1 and 2 configs are
//   edited in place, and only versions 3 and 4 (containerd 2.x) get a drop-in.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/finding.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

// The newest config version read and written: containerd 2.3's (`containerd config default`
// of v2.3.4 starts `version = 4`).
inline constexpr int kMaxConfigVersion = 4;

struct ContainerdConfig {
  std::string path;
  int version = 1;  // containerd 1.x reads a file without "version" as version 1
  // No version line, yet read as version 2: the file names the CRI plugin by its full name.
  bool implicit_version = false;
  toml::table doc;
};

Result<ContainerdConfig> parse_containerd_config(std::string_view text, std::string_view origin);
std::string cri_plugin_name(int version);
// The TOML header path of a runtime: plugins."io.containerd.grpc.v1.cri".containerd.runtimes.<n>
std::string runtime_table_name(int version, std::string_view runtime);

struct RuntimeHandler {
  std::string name;
  std::string runtime_type;
  std::string runtime_engine;
  std::string runtime_root;                    // deprecated, runtime.v1.linux only
  std::string runtime_path;                    // containerd 1.7+: the shim binary to run instead
  std::optional<std::string> binary_name;      // options.BinaryName
  std::optional<std::string> options_runtime;  // options.Runtime (runtime.v1.linux's binary)
  std::vector<std::string> option_keys;
  std::vector<std::string> pod_annotations, container_annotations;
};

// The runtime table a new handler inherits its options from: the default runtime (what the
// kubelet's pods use today, so the cgroup driver matches), else "runc"; nullptr when neither is
// a runc-family table. `skip` names a runtime not to inherit from (our own handler on a re-run).
const toml::table* inherit_base_runtime(const ContainerdConfig& cfg, std::string_view skip,
                                        std::string* chosen = nullptr);

// Whether a containerd `pod_annotations` pattern lets a pod annotation under cdi.k8s.io/ through
// to the container spec: containerd matches each pod annotation key with Go's path.Match and
// ignores its error (getPassthroughAnnotations, internal/cri/util/util.go in 2.x, pkg/cri/server
// helpers.go in 1.7), so the judgement is go_path_match's, exactly (common/go_match.hpp; a
// malformed pattern passes nothing). The witness is a key such a pattern lets through; a pattern
// too complex to decide yields a placeholder witness (fail closed). The one definition used by
// check-containerd, the doctor and setup containerd (docs/containerd-setup.md).
std::optional<std::string> pod_annotation_cdi_witness(std::string_view pattern);
bool pod_annotation_pattern_admits_cdi(std::string_view pattern);

// The CRI plugin's CDI settings: enable_cdi (default off in containerd 1.7 with versions 1-2, on
// with version 3 / containerd 2.x) and cdi_spec_dirs (default /etc/cdi, /var/run/cdi).
struct CdiSettings {
  bool enabled = false;
  bool explicitly_set = false;
  std::vector<std::string> spec_dirs = {"/etc/cdi", "/var/run/cdi"};
};
CdiSettings cdi_settings(const ContainerdConfig& cfg);

// containerd's NRI plugin, [plugins."io.containerd.nri.v1.nri"] (containerd 1.7+, config version
// 2+; ctrd@v2.3.4:internal/nri/config.go `DefaultConfig`): off by default on 1.7, on from 2.0.
// `default_validator` (containerd >= 2.2, nri@v0.10.0:plugins/default-validator) fails a
// container's creation when a plugin in `required_plugins` did not take part (docs/nri.md).
inline constexpr std::string_view kNriPlugin = "io.containerd.nri.v1.nri";
inline constexpr std::string_view kNriDefaultSocket = "/var/run/nri/nri.sock";
struct NriSettings {
  bool enabled = false;
  bool explicitly_set = false;  // `disable` is in the file
  std::string socket_path = std::string(kNriDefaultSocket);
  bool validator_enabled = false;
  std::vector<std::string> required_plugins;
  std::string tolerate_annotation;
};
// `containerd_major`: the running containerd's major release when known (2.x defaults NRI on);
// else the config's version decides (3 and 4 are only read by 2.x).
NriSettings nri_settings(const ContainerdConfig& cfg, std::optional<int> containerd_major = {});

std::vector<RuntimeHandler> cri_runtimes(const ContainerdConfig& cfg);
// Whether the file has a runtime table `name` under the CRI plugin of ANY config version, not
// only its own: containerd 2.x migrates an older file's tables into its own names before it
// merges imports, so a drop-in that declares no version (or another) still lands there.
bool defines_runtime_in_any_version(const ContainerdConfig& cfg, std::string_view name);
// A key of runc's Options (containerd runtime/v2/runc/options/oci.proto) as TOML spells it.
bool is_runc_option_key(std::string_view key);
// A runtime_type whose shim is runc's, which runs options.BinaryName ("" is containerd's default,
// runc v2).
bool is_runc_shim_type(std::string_view runtime_type);
// default_runtime_name, or "runc" when unset (containerd's default).
std::string default_runtime_name(const ContainerdConfig& cfg);

// Applies the file's imports (relative paths resolve against its directory; globs allowed) the
// way containerd would: versions 1-2 replace each plugin section, version 3 merges deeply.
// `read` reads a file (so tests and the doctor go through HostFs).
Result<ContainerdConfig> merge_imports(
    const ContainerdConfig& main,
    const std::function<Result<std::string>(const std::string&)>& read,
    const std::function<std::vector<std::string>(const std::string&)>& glob);

// merge_imports with files read, and import globs expanded (go_glob), under a HostFs root.
Result<ContainerdConfig> merge_imports_from_host(const ContainerdConfig& main, const HostFs& host);

// The files an import names, as containerd (resolveImports) and k0s expand it on the host: a
// path without '*' names itself when it exists; one with '*' is Go's filepath.Glob, each
// directory's names sorted bytewise and matched with Go's Match, in which '*' matches a leading
// dot (".toml" and ".x.toml" are drop-ins to containerd and k0s; glob(3) would skip them). A
// malformed pattern matches nothing.
std::vector<std::string> go_glob(const HostFs& host, const std::string& pattern);

// The CRI runtime handler gpufence installs and RuntimeClasses name unless told otherwise:
// "nvidia", the name GPU Operator's RuntimeClass and NVIDIA's docs use, so pods that name it keep
// working.
inline constexpr std::string_view kDefaultHandlerName = "nvidia";

struct ContainerdCheckOptions {
  std::vector<std::string> handlers = {std::string(kDefaultHandlerName)};  // RuntimeClasses' names
  const HostFs* host = nullptr;  // to check BinaryName; skipped when null
  bool expect_gpufence = false;  // warn when a handler is not wired to a GPU runtime
};

// Everything wrong with the config for GPU pods, each with the exact fix: a table of
// {id, check} (config.cpp), each check a function emitting findings of its id only, run in order.
std::vector<Finding> check_containerd_config(const ContainerdConfig& cfg,
                                             const ContainerdCheckOptions& options);
// The ids of those checks, in the order they run (stable: tests and docs name them).
const std::vector<std::string>& containerd_check_ids();

}  // namespace gpufence
