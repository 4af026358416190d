// `gpufence setup containerd`: add a runtime handler pointing at gpufence-runtime to a
// containerd configuration — plain containerd, microk8s's template, k3s's/rke2's template, or a
// drop-in of gpufence's own in k0s's containerd.d (where each keeps it:
// distribution/distribution.hpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "containerd/config.hpp"
#include "distribution/distribution.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

// --set-as-default also makes gpufence-runtime the runtime of pods without a runtimeClassName,
// the node agents' own among them: refused unless the caller says so explicitly.
enum class DefaultForNodeAgents { refuse, accept };

// Whether the runtime handler is written: `install --enforcement nri` leaves it out (the shim
// then runs only as gpufence-nri's hook binary).
enum class HandlerEdit { write, skip };

// What `install --enforcement nri|both` sets in containerd's NRI plugin table (docs/nri.md):
// `disable = false` (needed on 1.7, where NRI is off by default; stated on 2.x too, so a user's
// `disable = true` does not silently win), and on containerd >= 2.2 the default validator with
// `required_plugins` (gpufence-nri, the decider, and gpufence-fence, the validator that rejects
// what the decider did not decide), so containers fail to be created while either is down.
struct NriEdit {
  bool enable = false;
  // Added to default_validator.required_plugins (the file's own entries kept); empty: the
  // validator is not touched (containerd < 2.2 has none).
  std::vector<std::string> required_plugins;
  // default_validator.tolerate_missing_plugins_annotation; "" writes none. NRI reads that key
  // from the POD's annotations (KEY, KEY/pod, KEY/container.NAME: nri@v0.12.0 pkg/plugin
  // GetEffectiveAnnotation), so it is a waiver every pod holds unless admission forbids it.
  std::string tolerate_annotation;
  // The key an earlier install wrote there and the file still holds: taken out when
  // `tolerate_annotation` does not name it (a drop-in is rewritten whole anyway).
  std::string earlier_tolerate_annotation;
};

struct SetupOptions {
  // Whose config: the table's config_input is the file edited when config_path is empty (k3s,
  // rke2: the planner picks config-v3.toml.tmpl instead where k3s renders version 3).
  Distribution distribution = Distribution::containerd;
  std::string config_path;
  std::string runtime_name = std::string(kDefaultHandlerName);
  std::string binary = std::string(kRuntimeBinaryPath);
  bool set_as_default = false;
  DefaultForNodeAgents node_agents = DefaultForNodeAgents::refuse;
  std::optional<int> version;  // for a new file or a k3s template (default: detected, else 2)
  // The config version the node's containerd itself writes (1.x: 2, 2.0-2.2: 3, 2.3: 4), when
  // known (install asks the running containerd): a new file and a k3s template that does not
  // say follow it, and k3s's template file is the one that containerd line renders.
  std::optional<int> node_version;
  // Versions 3-4: default <config dir>/conf.d/99-gpufence.toml. k0s: the drop-in gpufence owns
  // (default the table's config_input, /etc/k0s/containerd.d/gpufence.toml; config_path, when
  // set, names it too, as install's --containerd-config does).
  std::string drop_in_path;
  HandlerEdit handler = HandlerEdit::write;
  NriEdit nri;
};

// The config version `containerd config default` of a containerd release writes: 2 for 1.x, 3
// for 2.0 to 2.2, 4 from 2.3 (version.ConfigVersion). `release` as CRI's runtime_version or
// `containerd --version` print it ("v2.3.4", "1.6.20~ds1", "v2.0.4-k3s2"); nullopt when unreadable.
std::optional<int> config_version_of_release(std::string_view release);

// How a change's path may be resolved when root writes it. A config of the user's may be a
// symlink that config management keeps (it stays one: its target is written); a file only
// gpufence writes (k0s's drop-in) is written where its name is, with no link in any component.
enum class LinkPolicy { follow, refuse };

struct FileChange {
  std::string path;
  bool existed = false;
  std::string old_text;
  std::string new_text;
  LinkPolicy links = LinkPolicy::follow;
};

struct SetupPlan {
  std::string config_path;          // the file the node's containerd reads (k3s: the template)
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

// The same with the backups' host paths chosen beforehand (install records them in its journal
// before the first byte changes): `backups[i]` for plan.changes[i], empty for none. Each is
// created exclusively; a name taken since it was chosen fails before its file is written.
Status apply_setup_plan_with(const SetupPlan& plan, const HostFs& host,
                             const std::vector<std::string>& backups);

// A backup host path for each change that replaces an existing file ("" for a new file), free
// now: "<file>.bak-<UTC time>[.N]".
std::vector<std::string> choose_backup_paths(const SetupPlan& plan, const HostFs& host);

// For a LinkPolicy::refuse path: no component under the host root is a symbolic link, and the
// file, when present, is a regular file. Checked again right before the write.
Status check_own_file_path(const HostFs& host, const std::string& path);

// Writes a LinkPolicy::refuse file atomically: checked as above, then written with no symlink
// followed in any component (a link planted at the name is replaced, never written through);
// a missing last directory is made.
Status write_own_file(const HostFs& host, const std::string& path, std::string_view text);

// k0s: no other drop-in beside `drop_in` (<dir>/*.toml, which k0s and containerd merge into one
// CRI table, in name order) defines a runtime called `name`: merged with gpufence's, its keys
// (another BinaryName, a runtime_path, pod annotations) would win or stay. An unreadable or
// unparsable drop-in is an error too (k0s itself stops on one).
Status check_k0s_runtime_name(const HostFs& host, const std::string& drop_in,
                              const std::string& name);

std::string runtime_class_manifest(const std::string& handler);

}  // namespace gpufence
