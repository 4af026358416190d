// install and uninstall, as named steps in files of one concern (install.cpp runs them):
//   record.cpp     what the record (install-state.json) and a recorded file hold now, and the
//                  host reads and writes every step goes through;
//   plan.cpp       everything install will do, worked out before the first byte changes, and
//                  the journal that records each step as it is done;
//   steps.cpp      the steps: layout, binaries, runtime.toml, gpufence-nri, CDI, containerd's
//                  config, the restart and the verification through CRI;
//   undo.cpp       a failed step's undo, back to the state before the run;
//   uninstall.cpp  uninstall, from the record.
// Internal to the install library: install/install.hpp is its interface.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "containerd/setup.hpp"
#include "install/install.hpp"
#include "install/state.hpp"

namespace gpufence::install_flow {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// One invocation's working state: the options, the seams, the layout and the report so far.
struct Run {
  const InstallOptions& opt;
  const InstallEnv& env;
  InstallReport& report;
  NodeLayout layout;
  std::string binary_target;  // host path of the versioned shim the link points at
  bool restart_attempted = false;
  EnforcementChoice choice;  // set by plan_install

  void step(std::string name, Outcome outcome, std::string detail) {
    report.steps.push_back({std::move(name), outcome, std::move(detail)});
  }
  // Records a failed step and the reason the command exits non-zero.
  bool failed(std::string name, std::string why) {
    step(name, Outcome::failed, why);
    report.failure = cat(name, ": ", why);
    return false;
  }
};

// What a recorded file holds now (record.cpp classify).
enum class Holds {
  user,         // the user's bytes (or absent, for a file install created): nothing to undo
  ours,         // a text install wrote: undo restores the backup or removes the file
  edited,       // something else: edited since install, left alone
  backup_gone,  // install's text, but the user's bytes are nowhere
};

// Everything install will do, worked out before the first byte changes.
struct InstallPlan {
  std::string binary_target;
  std::optional<std::string> previous_link;  // what the stable link named before this run
  bool target_existed = false;
  bool create_runtime_config = false;
  std::optional<std::string> cdi_text;  // set: the spec is (re)written
  std::optional<std::string> cdi_old;   // its text before this run
  std::string cdi_backup;               // set: the user's spec is backed up here first
  SetupPlan config;
  std::vector<std::string> backups;  // per config change: "" for a file already recorded
  std::vector<std::string> new_dirs;
  // nri and both: gpufence-nri's versioned file and links, as they were before this run.
  bool nri = false;
  std::string nri_target;
  std::optional<std::string> nri_previous_link;
  bool nri_target_existed = false;
  std::string nri_plugin_link;                   // <plugin_path>/NN-name
  std::optional<std::string> nri_plugin_before;  // what that link named before this run
  // containerd >= 2.2: the fence's <plugin_path>/NN-name ("" below), and what it named before.
  std::string nri_fence_link;
  std::optional<std::string> nri_fence_before;
};

// record.cpp: the record and the host reads and writes
Result<std::optional<std::string>> absent_is_empty(Result<std::string> text);
Result<std::optional<std::string>> read_host(const HostFs& host, const std::string& path);
Result<std::optional<std::string>> read_backup(const HostFs& host, const std::string& path);
Status write_host(const HostFs& host, const std::string& path, std::string_view text);
std::string shell_words(const std::vector<std::string>& argv);
bool contains(const std::vector<std::string>& texts, const std::string& text);
Result<Holds> classify(const HostFs& host, const InstallState::ManagedFile& f);
void unlink_host(const HostFs& host, const std::string& path);
void remove_stale_temps(const HostFs& host, const std::string& path);
void remove_stale_temps(const HostFs& host, const InstallState& state,
                        const std::string& state_file);
void remove_created_dirs(const HostFs& host, const std::vector<std::string>& dirs);
Status forget_what_is_the_users(const HostFs& host, InstallState& state);
void missing_parents(const HostFs& host, const std::string& path, std::vector<std::string>& out);
Result<InstallState> load_state(const HostFs& host, const std::string& path);

// plan.cpp: the plan and the journal
std::string cdi_backup_path(const HostFs& host, const std::string& path,
                            const std::string& old_text);
std::string earlier_waiver(const HostFs& host, const InstallState& state);
bool plan_install(Run& r, const InstallState& state, InstallPlan& plan);
InstallState journal_for(const Run& r, const InstallState& state, const InstallPlan& plan);
bool save_state(Run& r, const InstallState& state);
bool record(Run& r, InstallState& journal, std::string step);

// steps.cpp: the steps
bool find_layout(Run& r);
bool put_binary(Run& r);
bool smoke_test_binary(Run& r);
bool is_namespace_name(std::string_view s);
Result<std::string> runtime_config_text(const std::string& nvml_library,
                                        const std::string& node_agent_namespace,
                                        const std::vector<std::string>& gpu_cdi_kinds);
bool put_runtime_config(Run& r, const InstallPlan& plan, const InstallState& journal);
std::string nri_plugin_text(const Run& r, const InstallPlan& plan);
bool put_nri_plugin(Run& r, const InstallPlan& plan);
bool put_cdi_spec(Run& r, const InstallPlan& plan);
std::string already_configured(const Run& r);
bool edit_containerd_config(Run& r, const InstallPlan& plan);
Result<std::vector<LoadedRuntime>> probe_once(const Run& r, milliseconds timeout);
Result<std::vector<LoadedRuntime>> wait_ready(const Run& r);
bool has_handler(const std::vector<LoadedRuntime>& loaded, const std::string& name,
                 const std::string& binary);
std::optional<std::string> handler_weakness(const std::vector<LoadedRuntime>& loaded,
                                            const std::string& name);
std::string weakness_text(const Run& r, const std::string& why);
bool nri_listening(const Run& r);
bool enforced(const Run& r, const std::vector<LoadedRuntime>& loaded);
std::string enforced_text(const Run& r);
Status restart_containerd(Run& r);

// undo.cpp: the undo
void undo_run(Run& r, const InstallPlan& plan, const InstallState& prior, bool had_state,
              bool config_written);

// uninstall.cpp: uninstall
InstallReport uninstall_locked(const InstallOptions& opt, const InstallEnv& env,
                               std::vector<std::string>& dirs_after);

}  // namespace gpufence::install_flow
