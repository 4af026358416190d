// The shim's side of CDI: find the requested GPU devices (kGpuCdiKinds) in the spec directories
// and apply their containerEdits (device nodes, mounts, env, hooks, additional GIDs) to
// config.json. Reading follows the CDI project's registry (cdi/spec_dirs.hpp, docs/cdi.md): specs
// of other kinds are never judged and never block a container; specs of a requested kind are read
// strictly and fail closed: a malformed one, a device no spec defines, two files of one directory
// defining it.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cdi/spec.hpp"
#include "cdi/spec_dirs.hpp"
#include "common/hostfs.hpp"
#include "common/log.hpp"
#include "runtime/host_devices.hpp"
#include "runtime/isolation.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

// The specs of `kinds` in `dirs` (missing dirs are skipped), with upstream's priority applied: a
// device defined in a later directory is removed from the earlier directories' files. Files of
// other kinds, and files whose kind cannot be read, are skipped; a malformed spec of one of
// `kinds` is an error naming the file and the field.
Result<std::vector<CdiSpecFile>> load_cdi_specs(const std::vector<std::string>& dirs,
                                                const std::vector<std::string_view>& kinds);
// The same, logging each skipped file (debug: another kind; warn: unreadable) and each device a
// later directory overrides (info).
Result<std::vector<CdiSpecFile>> load_cdi_specs(const std::vector<std::string>& dirs,
                                                const std::vector<std::string_view>& kinds,
                                                Logger& log);

struct CdiApplied {
  // Every device node the edits added whose cgroup access is not "none", with major/minor.
  std::vector<DeviceNode> nodes;
  // Device cgroup access the spec gives each node by path: "rwm" when it says nothing, else its
  // `permissions` ("r", "rw", ...); "" for "none" (such a node is not in `nodes`).
  std::map<std::string, std::string> access;
  std::vector<std::string> from;    // "gpufence.io/gpu=1 (/var/run/cdi/gpufence.io-gpu.json)"
  std::vector<std::string> mounts;  // each mount added, "destination<-source"
};

// The edits `names` (qualified, "gpufence.io/gpu=GPU-...") select, in upstream's order: each
// spec used, its spec-wide edits once, then each device's (InjectDevices). A name no spec
// defines, or two files of one directory define, is an error.
struct CdiSelection {
  struct Step {
    CdiContainerEdits edits;
    std::string where;  // the file, and the device, for errors
  };
  std::vector<Step> edits;
  std::vector<std::string> from;  // "gpufence.io/gpu=1 (/var/run/cdi/gpufence.io-gpu.json)"
};
Result<CdiSelection> select_cdi_devices(const std::vector<CdiSpecFile>& specs,
                                        const std::vector<std::string>& names);

// What applying `selection` needs from the host: the nodes without major/minor (hostPath, else
// path), and the DRM list when a node may be a DRM node.
HostDeviceQuery host_device_query(const CdiSelection& selection);

// The GPUs (as minors of char 195:N, N <= kNvidiaMaxGpuMinor) among the device nodes the
// selected edits give a container, spec-wide and per device: what the runtime injects for them,
// judged by device number. A node without numbers takes the host's (facts); one the host lacks
// is an error, as it is for the runtime's own injection.
Result<std::vector<unsigned>> gpu_minors_of_selection(const CdiSelection& selection,
                                                      const HostDeviceFacts& facts);

// Applies the selected edits; device nodes without major/minor take the numbers `facts` read.
// Hooks without `env` get kMinimalHookEnv and hooks without `timeout`
// kDefaultHookTimeoutSeconds (hook_defaults.hpp). Edits gpufence cannot apply faithfully
// (intelRdt, netDevices) refuse the create.
Result<CdiApplied> apply_cdi_selection(Json& oci, const CdiSelection& selection,
                                       const HostDeviceFacts& facts);

// The three steps at once, the facts read through `host`.
Result<CdiApplied> apply_cdi_devices(Json& oci, const std::vector<CdiSpecFile>& specs,
                                     const std::vector<std::string>& names, const HostFs& host);

}  // namespace gpufence
