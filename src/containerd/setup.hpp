// `gpufence setup containerd`: add a runtime handler pointing at gpufence-runtime to a
// containerd configuration — plain containerd, microk8s's template, or k3s's template.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "containerd/config.hpp"

namespace gpufence {

enum class Flavor { containerd, microk8s, k3s };

Result<Flavor> parse_flavor(std::string_view name);
// /etc/containerd/config.toml, the microk8s template, or k3s's config.toml.tmpl.
std::string default_config_path(Flavor flavor);

struct SetupOptions {
  Flavor flavor = Flavor::containerd;
  std::string config_path;  // default_config_path(flavor) when empty
  std::string runtime_name = "nvidia";
  std::string binary = "/usr/local/bin/gpufence-runtime";
  bool set_as_default = false;
  std::optional<int> version;  // for a new file or a k3s template (default 2)
  std::string drop_in_path;    // version 3: default <config dir>/conf.d/99-gpufence.toml
};

struct FileChange {
  std::string path;
  bool existed = false;
  std::string old_text;
  std::string new_text;
};

struct SetupPlan {
  std::vector<FileChange> changes;  // only files whose text changes; empty = already configured
  std::vector<std::string> notes;   // things the user should know (pre-existing problems, restarts)
};

using ReadFile =
    std::function<Result<std::optional<std::string>>(const std::string& path)>;  // nullopt = absent

// Works out every file change, then parses the result back and checks it: the handler exists
// with BinaryName, and default_runtime_name names a defined runtime. Touches nothing.
Result<SetupPlan> plan_containerd_setup(const SetupOptions& options, const ReadFile& read);

// Writes each change atomically, keeping a backup "<file>.bak-<UTC time>" of every file replaced.
Result<std::vector<std::string>> apply_setup_plan(const SetupPlan& plan);

std::string runtime_class_manifest(const std::string& handler);

}  // namespace gpufence
