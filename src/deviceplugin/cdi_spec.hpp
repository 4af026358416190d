// The device plugin's own CDI spec, kind gpufence.io/gpu (docs/deviceplugin.md, "CDI spec"):
// containerd 2.x (CDI on by default) and 1.7 with enable_cdi resolve the plugin's cdi.k8s.io/*
// annotations themselves, before any runtime runs, so a node with no spec fails every GPU pod.
// The plugin therefore writes one at start, as NVIDIA's plugin does, from the same generator as
// `gpufence cdi generate`, and rewrites it whenever it is found missing or different.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "cdi/generate.hpp"
#include "common/hostfs.hpp"
#include "gpu/gpu.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

inline constexpr const char* kPluginCdiSpecFile = "gpufence.io-gpu.json";
// The file plugins before the own kind wrote (kind nvidia.com/gpu). Left beside NVIDIA's toolkit's
// spec it would cancel every nvidia.com/gpu name both define, so the plugin removes it.
inline constexpr const char* kLegacyPluginCdiSpecFile = "gpufence-nvidia.com-gpu.json";

struct PluginCdiSpecOptions {
  // The directory as this process sees it (mount the host's /var/run/cdi there); "" = off.
  std::string dir = "/var/run/cdi";
  std::string file_name = kPluginCdiSpecFile;
  std::string hook_path = std::string(kRuntimeBinaryPath);  // a host path: runc runs it
  // Prefix of device node hostPaths, as DeviceSpec host_path (PluginOptions::dev_root).
  std::string dev_root = "/";
  // Host path of the driver's root filesystem (GPU Operator: /run/nvidia/driver), read under
  // --host-root; the driver files' hostPaths start with it.
  std::string driver_root = "/";
};

// The spec for `gpus`: read through `host` (--host-root), naming host paths. Driver files are
// optional: without them it holds the device nodes (by index, UUID and "all") and the control
// nodes. Every device node gets hostPath = dev_root + path when dev_root is not "/".
Result<CdiGenerateResult> build_plugin_cdi_spec(const HostFs& host, const std::vector<Gpu>& gpus,
                                                const PluginCdiSpecOptions& options);

enum class SpecWrite { written, unchanged };

// Writes `spec` as JSON to dir/file_name atomically (temp file + rename: a runtime reading the
// directory sees the old file or the new one, never half of one), creating `dir` when missing.
// Leaves a file with the same content alone.
Result<SpecWrite> write_plugin_cdi_spec(const CdiSpec& spec, const PluginCdiSpecOptions& options);

std::filesystem::path plugin_cdi_spec_path(const PluginCdiSpecOptions& options);

// Removes kLegacyPluginCdiSpecFile from the directory (the name itself, never what a link there
// points to); true when there was one.
Result<bool> remove_legacy_plugin_cdi_spec(const PluginCdiSpecOptions& options);

}  // namespace gpufence
