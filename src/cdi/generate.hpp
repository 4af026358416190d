// `gpufence cdi generate`: a CDI spec for the host's GPUs — one device per GPU by index and by
// UUID plus "all", each with its /dev/nvidiaN; spec-wide the control nodes, the driver's
// libraries (from the driver root's /etc/ld.so.cache, standard directories as fallback), the
// utilities, GSP firmware, the persistenced socket, and a hook that refreshes the container's
// linker cache. Every file is looked up through HostFs, so tests run on fake driver trees.
#pragma once

#include <string>
#include <vector>

#include "cdi/spec.hpp"
#include "common/hostfs.hpp"
#include "gpu/gpu.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

// required: no driver library found is an error (`gpufence cdi generate`). optional: it is a
// warning and the spec holds the device nodes only, with no linker-cache hook (the device
// plugin's own spec, written on nodes whose driver files it cannot see).
enum class DriverFiles { required, optional };

struct CdiGenerateOptions {
  std::string driver_root = "/";  // GPU Operator installs the driver under /run/nvidia/driver
  std::string hook_path = std::string(kRuntimeBinaryPath);
  std::string kind = std::string(kNvidiaCdiKind);  // as nvidia-ctk writes it
  DriverFiles driver_files = DriverFiles::required;
};

struct CdiGenerateResult {
  CdiSpec spec;
  std::vector<std::string> warnings;  // driver files expected but not found
};

// `host` reads the host (root = --host-root); paths written into the spec are host paths.
// `driver_version` picks the GSP firmware directory.
Result<CdiGenerateResult> generate_cdi_spec(const HostFs& host, const std::vector<Gpu>& gpus,
                                            const std::string& driver_version,
                                            const CdiGenerateOptions& options);

}  // namespace gpufence
