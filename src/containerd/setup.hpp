// `gpufence setup containerd`: add a runtime handler pointing at gpufence-runtime to a
// containerd configuration — plain containerd, microk8s's template, or k3s's template.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "containerd/config.hpp"

namespace gpufence {

enum class Flavor { containerd, microk8s, k3s, rke2 };

Result<Flavor> parse_flavor(std::string_view name);
// /etc/containerd/config.toml, the microk8s template, or k3s's/rke2's config.toml.tmpl (the
// planner picks config-v3.toml.tmpl instead where k3s renders version 3).
std::string default_config_path(Flavor flavor);

// --set-as-default also makes gpufence-runtime the runtime of pods without a runtimeClassName,
// the node agents' own among them: refused unless the caller says so explicitly.
enum class DefaultForNodeAgents { refuse, accept };

struct SetupOptions {
  Flavor flavor = Flavor::containerd;
  std::string config_path;  // default_config_path(flavor) when empty
  std::string runtime_name = "nvidia";
  std::string binary = "/usr/local/bin/gpufence-runtime";
  bool set_as_default = false;
  DefaultForNodeAgents node_agents = DefaultForNodeAgents::refuse;
  std::optional<int> version;  // for a new file or a k3s template (default: detected, else 2)
  std::string drop_in_path;    // version 3: default <config dir>/conf.d/99-gpufence.toml
};

struct FileChange {
  std::string path;
  bool existed = false;
  std::string old_text;
  std::string new_text;
};

struct SetupPlan {
  std::string handler_name;         // the handler written (k3s: may differ from the one asked for)
  std::vector<FileChange> changes;  // only files whose text changes; empty = already configured
  std::vector<std::string> notes;   // things the user should know (pre-existing problems, restarts)
};

using ReadFile =
    std::function<Result<std::optional<std::string>>(const std::string& path)>;  // nullopt = absent

// Whether an executable exists at a host path (k3s's runtime detection); absent = never.
using IsExecutable = std::function<bool(const std::string& path)>;

// Works out every file change, then parses the result back and checks it: the handler exists
// with BinaryName, and default_runtime_name names a defined runtime. Touches nothing. Paths are
// host paths; `read` and `executable` resolve them (under --host-root).
Result<SetupPlan> plan_containerd_setup(const SetupOptions& options, const ReadFile& read,
                                        const IsExecutable& executable = {});

// Writes each change atomically under `host`'s root, after a backup "<file>.bak-<UTC time>[.N]"
// created exclusively (never replacing anything) of every file replaced. A symlinked file stays a
// symlink: its target is what gets replaced. Refuses a file that changed since it was planned.
Result<std::vector<std::string>> apply_setup_plan(const SetupPlan& plan,
                                                  const HostFs& host = HostFs("/"));

std::string runtime_class_manifest(const std::string& handler);

}  // namespace gpufence
