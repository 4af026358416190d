// Reads a runc command line the way runc 1.1 does (urfave/cli v1.22 over Go's flag package):
// global flags up to the first positional, which names the command; then, for create, run and
// restore, urfave's reorderArgs moves every flag it recognises -- also those after the container
// id -- in front of the positionals before Go's flag package reads them, so
// `create ID --bundle B` runs B. containerd's runc shim calls
//   --root /run/containerd/runc/<ns> --log <dir>/log.json --log-format json create
//   --bundle <dir> --pid-file <dir>/init.pid <id>
// Every form is read as Debian's runc 1.1.5 read it (the table in
// tests/unit/test_runtime_runc_args.cpp; docs/containerd-runtime.md).
#pragma once

#include <string>
#include <vector>

namespace gpufence {

struct RuncInvocation {
  std::string subcommand;       // empty for `runc --version`, `runc --help` or no arguments
  std::string bundle;           // for create/run/restore: --bundle/-b, else the working directory
  std::string container_id;     // the one positional after the command's flags
  std::string log_path;         // global --log: where containerd reads the runtime's error from
  std::string log_format;       // global --log-format: "text" (runc's default) or "json"
  bool systemd_cgroup = false;  // global --systemd-cgroup (containerd's SystemdCgroup = true)
  bool help = false;            // `create ... --help`: runc prints the command's help, no more
  // Non-empty when runc 1.1 rejects the command line (an unknown or malformed flag, a missing
  // value, two forms of one flag, not exactly one container id): why. The shim refuses such a
  // create rather than guess which bundle runc would have read.
  std::string unreadable;
  // Every command that creates a container from the bundle's config.json: none may run unedited.
  bool edits_spec() const {
    return !help && (subcommand == "create" || subcommand == "run" || subcommand == "restore");
  }
};

// `args` excludes argv[0]. Never fails: what runc would reject is said in `unreadable`.
RuncInvocation parse_runc_args(const std::vector<std::string>& args);

}  // namespace gpufence
