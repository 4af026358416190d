// gpufence's own paths on a node: the one definition of each, which the installer writes, the
// runtimes and agents read, and every flag default names. All are host paths (under the host root
// a command is given); a user's config may name others, never a pod.
#pragma once

#include <string_view>

namespace gpufence::paths {

// The stable link `gpufence install` makes to the installed gpufence-runtime, which containerd's
// handler BinaryName and the CDI specs' hooks name (runc runs it by this path).
inline constexpr std::string_view kRuntimeBinary = "/usr/local/bin/gpufence-runtime";
// The same for gpufence-nri, which containerd's NRI plugin_path links to.
inline constexpr std::string_view kNriBinary = "/usr/local/bin/gpufence-nri";
// Where install keeps the versioned binaries the links point at.
inline constexpr std::string_view kVersionsDir = "/usr/local/lib/gpufence";
// The runtimes' config (override: $GPUFENCE_RUNTIME_CONFIG), every key in deploy/runtime.toml.
inline constexpr std::string_view kRuntimeConfig = "/etc/gpufence/runtime.toml";
// install's record of what it changed, which uninstall and the doctor read.
inline constexpr std::string_view kInstallState = "/etc/gpufence/install-state.json";
// gpufence's own state directory, which no common hostPath covers, and what lives in it.
inline constexpr std::string_view kStateDir = "/var/lib/gpufence";
inline constexpr std::string_view kRuntimeLog = "/var/lib/gpufence/runtime.log";
inline constexpr std::string_view kNriStatus = "/var/lib/gpufence/nri-status.json";
inline constexpr std::string_view kDraStateDir = "/var/lib/gpufence/dra";

// gpufence-nri's plugin name: containerd's required_plugins entry, the NN-name link, its logs.
inline constexpr std::string_view kNriPluginName = "gpufence-nri";

}  // namespace gpufence::paths
