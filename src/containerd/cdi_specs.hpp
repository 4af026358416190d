// The CDI spec files containerd (enable_cdi) and gpufence-runtime read from cdi_spec_dirs, as
// the doctor and check-containerd need them: which kind each file declares and its device names.
#pragma once

#include <string>
#include <vector>

#include "common/hostfs.hpp"

namespace gpufence {

inline constexpr std::string_view kGpuCdiKind = "nvidia.com/gpu";

struct CdiSpecFile {
  std::string path;                  // host path
  std::string kind;                  // "" when it could not be read at all
  std::vector<std::string> devices;  // device names; empty when `error` is set
  std::string error;                 // why it did not parse (kind then comes from a text scan)
};

// Every *.json, *.yaml and *.yml directly in each directory (missing directories are skipped),
// in directory order, files sorted by name.
std::vector<CdiSpecFile> read_cdi_spec_dirs(const HostFs& host,
                                            const std::vector<std::string>& dirs);

}  // namespace gpufence
