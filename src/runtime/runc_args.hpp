// Reads a runc command line the way runc (urfave/cli over Go's flag package) does: global flags
// first, then the subcommand, its flags, then the container id. containerd's runc shim calls
//   --root /run/containerd/runc/<ns> --log <dir>/log.json --log-format json create
//   --bundle <dir> --pid-file <dir>/init.pid <id>
// so the subcommand is never simply argv[1] (docs/containerd-runtime.md).
#pragma once

#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct RuncInvocation {
  std::string subcommand;       // empty for `runc --version`, `runc --help` or no arguments
  std::string bundle;           // for create/run/restore: --bundle/-b, else the working directory
  std::string container_id;     // first positional after the subcommand's flags
  std::string log_path;         // global --log: where containerd reads the runtime's error from
  std::string log_format;       // global --log-format: "text" (runc's default) or "json"
  bool systemd_cgroup = false;  // global --systemd-cgroup (containerd's SystemdCgroup = true)
  // Every command that creates a container from the bundle's config.json: none may run unedited.
  bool edits_spec() const {
    return subcommand == "create" || subcommand == "run" || subcommand == "restore";
  }
};

// `args` excludes argv[0]. Errors only for a create/run whose flags cannot be read.
Result<RuncInvocation> parse_runc_args(const std::vector<std::string>& args);

}  // namespace gpufence
