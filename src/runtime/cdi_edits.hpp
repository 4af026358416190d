// The shim's side of CDI: find the requested nvidia.com/gpu devices in the spec directories and
// apply their containerEdits (device nodes, mounts, env, hooks) to config.json, failing closed
// on anything it cannot prove: a malformed spec, a device no spec defines, two specs defining it.
#pragma once

#include <string>
#include <vector>

#include "cdi/spec.hpp"
#include "common/hostfs.hpp"
#include "runtime/isolation.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

struct CdiSpecFile {
  std::string path;
  CdiSpec spec;
};

// Every *.yaml, *.yml and *.json in `dirs` whose kind is `kind` (missing dirs are skipped).
// Any unreadable or malformed file is an error naming it: its kind cannot be known.
Result<std::vector<CdiSpecFile>> load_cdi_specs(const std::vector<std::string>& dirs,
                                                std::string_view kind);

struct CdiApplied {
  std::vector<DeviceNode> nodes;  // every device node the edits added, with major/minor
  std::vector<std::string> from;  // "nvidia.com/gpu=1 (/etc/cdi/nvidia.yaml)"
};

// Applies spec-wide and per-device edits for `names` (the part after "nvidia.com/gpu=").
// `host` resolves device nodes without major/minor (hostPath, else path).
Result<CdiApplied> apply_cdi_devices(Json& oci, const std::vector<CdiSpecFile>& specs,
                                     const std::vector<std::string>& names, const HostFs& host);

}  // namespace gpufence
