#include "install/install.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "containerd/setup.hpp"
#include "install/default_runtime_toml.hpp"
#include "install/lock.hpp"
#include "install/state.hpp"

namespace gpufence {
namespace {

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

// A host file's text; nullopt when absent.
Result<std::optional<std::string>> absent_is_empty(Result<std::string> text) {
  if (text) return std::optional<std::string>(std::move(*text));
  if (text.error().code == Errc::not_found) return std::optional<std::string>{};
  return std::unexpected(text.error());
}

Result<std::optional<std::string>> read_host(const HostFs& host, const std::string& path) {
  return absent_is_empty(host.read(path));
}

// A backup is gpufence's own file, written O_EXCL beside the config: a link at its name was
// planted, and restoring through it would copy whatever it names into the config. Refused.
Result<std::optional<std::string>> read_backup(const HostFs& host, const std::string& path) {
  return absent_is_empty(host.read_own(path));
}

// Writes through a symlinked file as setup does (docs/containerd-setup.md): the link stays a
// link and its target, taken under the host root, gets the text.
Status write_host(const HostFs& host, const std::string& path, std::string_view text) {
  auto real = write_target_through_links(host.resolve(path), host.root());
  if (!real) return std::unexpected(real.error());
  std::error_code ec;
  fs::create_directories(real->parent_path(), ec);
  if (ec) return fail(Errc::io, "create ", real->parent_path().native(), ": ", ec.message());
  return write_file_atomic(*real, text);
}

std::string shell_words(const std::vector<std::string>& argv) {
  return join(argv, " ");
}

// Step: which distribution, and so which config, socket and restart command.
bool find_layout(Run& r) {
  Distribution d;
  if (r.opt.distribution) {
    d = *r.opt.distribution;
  } else {
    auto detected = detect_distribution(r.env.host, r.report.notes);
    if (!detected) return r.failed("distribution", detected.error().message);
    d = *detected;
  }
  const DistributionRow& row = distribution_row(d);
  r.layout = layout_for(d, r.env.host);
  if (!r.opt.config_path.empty())
    r.layout.config_path = r.opt.config_path;
  else if (row.config_source == ConfigSource::go_template)
    r.layout.config_path.clear();  // the planner picks the template this node's k3s renders
  if (!r.opt.socket.empty()) r.layout.socket = r.opt.socket;
  if (!r.opt.restart_command.empty()) r.layout.restart = r.opt.restart_command;
  r.report.distribution = std::string(distribution_name(d));
  r.report.config_path = r.layout.config_path;
  r.report.socket = r.layout.socket;
  r.step("distribution", Outcome::unchanged,
         cat(distribution_name(d), ": config ",
             r.layout.config_path.empty() ? std::string("the template k3s renders")
                                          : r.layout.config_path,
             ", socket ", r.layout.socket));
  return true;
}

// Step: gpufence-runtime at its stable path, swapped in atomically.
bool put_binary(Run& r) {
  auto done = install_binary(r.env.host, r.opt.binary);
  if (!done) return r.failed("runtime binary", done.error().message);
  r.binary_target = done->target;
  r.step("runtime binary", done->changed == Changed::yes ? Outcome::changed : Outcome::unchanged,
         cat(r.opt.binary.link, " -> ", done->target));
  for (const auto& p : done->pruned) r.report.notes.push_back("removed old version " + p);
  return true;
}

// Step: the copied shim must start on the host (its glibc, its loader) before containerd is
// told to exec it for every GPU container: `gpufence-runtime --gpufence-help` touches nothing.
bool smoke_test_binary(Run& r) {
  // In the host's namespaces the stable link itself; run from here, the file it names (the
  // link's absolute target means nothing under a host root that is not "/").
  std::string path = r.opt.host_exec == HostExec::nsenter
                         ? r.opt.binary.link
                         : r.env.host.resolve(r.binary_target).string();
  auto argv = host_command(r.opt.host_exec, {path, "--gpufence-help"}, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return r.failed("runtime binary", res.error().message);
  if (res->exit_code != 0)
    return r.failed(
        "runtime binary",
        cat(r.opt.binary.link, " does not run on this host (`", shell_words(argv), "` exited ",
            res->exit_code, ": ", trim(res->out), "); containerd's config is left as it was"));
  return true;
}

// ---- what a recorded file holds now ----

enum class Holds {
  user,         // the user's bytes (or absent, for a file install created): nothing to undo
  ours,         // a text install wrote: undo restores the backup or removes the file
  edited,       // something else: edited since install, left alone
  backup_gone,  // install's text, but the user's bytes are nowhere
};

bool contains(const std::vector<std::string>& texts, const std::string& text) {
  return std::find(texts.begin(), texts.end(), text) != texts.end();
}

// The backup is written before the file (apply_setup_plan_with), so a file whose backup is
// absent was never written by the run that recorded it.
Result<Holds> classify(const HostFs& host, const InstallState::ManagedFile& f) {
  auto cur = read_host(host, f.path);
  if (!cur) return std::unexpected(cur.error());
  bool ours = cur->has_value() && contains(f.written, **cur);
  if (!f.existed) {
    if (!cur->has_value()) return Holds::user;
    if (f.written.empty()) return Holds::ours;  // an older record: the file install created
    return ours ? Holds::ours : Holds::edited;
  }
  auto backup = read_backup(host, f.backup);
  if (!backup) return std::unexpected(backup.error());
  if (backup->has_value()) {
    if (cur->has_value() && **cur == **backup) return Holds::user;
    return ours ? Holds::ours : Holds::edited;
  }
  return ours ? Holds::backup_gone : Holds::user;
}

void unlink_host(const HostFs& host, const std::string& path) {
  if (!path.empty()) ::unlink(host.resolve(path).c_str());
}

// Temporary files a killed run left beside `path`, by the one rule of every writer's temp names
// (is_temp_name_for, which also knows the shapes earlier releases left). Never active config: no
// temp name ends in .toml, so no import glob of containerd's picks one up.
void remove_stale_temps(const HostFs& host, const std::string& path) {
  if (path.empty()) return;
  fs::path p(path);
  auto names = host.list(p.parent_path().string());
  if (!names) return;
  const std::string name = p.filename().string();
  for (const auto& n : *names) {
    if (is_temp_name_for(n, name)) ::unlink(host.resolve((p.parent_path() / n).string()).c_str());
  }
}

// Every temporary file a killed run of install could have left, by the record.
void remove_stale_temps(const HostFs& host, const InstallState& state,
                        const std::string& state_file) {
  remove_stale_temps(host, state_file);
  for (const auto& f : state.config_files) remove_stale_temps(host, f.path);
  if (state.cdi_spec) remove_stale_temps(host, state.cdi_spec->path);
  if (state.runtime_config_path) remove_stale_temps(host, *state.runtime_config_path);
  remove_stale_temps(host, state.binary_link);
  remove_stale_temps(host, state.nri_binary_link);
  remove_stale_temps(host, state.nri_plugin_link);
  remove_stale_temps(host, state.nri_fence_link);
  if (auto names = host.list(state.versions_dir)) {
    for (const auto& n : *names)
      // gpufence's own directory: a temp file of any versioned binary is a leftover.
      if (temp_target_name(n)) ::unlink(host.resolve(state.versions_dir + "/" + n).c_str());
  }
}

// Directories install created, deepest first, while empty.
void remove_created_dirs(const HostFs& host, const std::vector<std::string>& dirs) {
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) ::rmdir(host.resolve(*d).c_str());
}

// The recorded files that hold the user's bytes again (a run killed before writing them, or an
// uninstall killed after restoring them) leave the record: their backups equal them.
Status forget_what_is_the_users(const HostFs& host, InstallState& state) {
  std::vector<InstallState::ManagedFile> kept;
  for (const auto& f : state.config_files) {
    auto h = classify(host, f);
    if (!h) return std::unexpected(h.error());
    if (*h == Holds::user) {
      unlink_host(host, f.backup);
      continue;
    }
    kept.push_back(f);
  }
  state.config_files = std::move(kept);
  if (state.config_files.empty()) state.config_changed = false;
  if (state.cdi_spec) {
    auto h = classify(host, *state.cdi_spec);
    if (!h) return std::unexpected(h.error());
    if (*h == Holds::user) {
      unlink_host(host, state.cdi_spec->backup);
      state.cdi_spec.reset();
    }
  }
  if (state.runtime_config_path) {
    auto cur = read_host(host, *state.runtime_config_path);
    if (!cur) return std::unexpected(cur.error());
    if (!cur->has_value()) {
      state.runtime_config_path.reset();
      state.runtime_config_written.reset();
    }
  }
  return {};
}

// Host directories that do not exist yet on the way to `path`, parents first.
void missing_parents(const HostFs& host, const std::string& path, std::vector<std::string>& out) {
  std::vector<std::string> chain;
  for (fs::path d = fs::path(path).parent_path(); !d.empty() && d != d.root_path();
       d = d.parent_path()) {
    if (host.exists(d.string())) break;
    chain.push_back(d.string());
  }
  for (auto c = chain.rbegin(); c != chain.rend(); ++c)
    if (!contains(out, *c)) out.push_back(*c);
}

Result<InstallState> load_state(const HostFs& host, const std::string& path) {
  auto text = read_host(host, path);
  if (!text) return std::unexpected(text.error());
  if (!text->has_value()) return InstallState{};
  return parse_install_state(**text, path);
}

// ---- install: the plan ----

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

std::string cdi_backup_path(const HostFs& host, const std::string& path,
                            const std::string& old_text) {
  SetupPlan p;
  p.changes.push_back({path, true, old_text, ""});
  return choose_backup_paths(p, host).front();
}

// The waiver key (default_validator.tolerate_missing_plugins_annotation) an earlier install
// wrote into a config file it recorded, which the file still holds: a key the user's bytes (the
// backup; nothing, for a file install created) do not have. A re-install takes it out; "" when
// there is none. Releases before this one wrote "gpufence.io/tolerate-missing-nri" by default.
std::string earlier_waiver(const HostFs& host, const InstallState& state) {
  if (!state.config_changed) return "";
  auto waiver = [](const std::optional<std::string>& text, const std::string& origin) {
    if (!text) return std::string();
    auto cfg = parse_containerd_config(*text, origin);
    return cfg ? nri_settings(*cfg).tolerate_annotation : std::string();
  };
  for (const auto& f : state.config_files) {
    auto now = read_host(host, f.path);
    if (!now) continue;
    std::string ours = waiver(*now, f.path);
    if (ours.empty()) continue;
    if (!f.existed) return ours;
    auto backup = read_backup(host, f.backup);
    if (backup && backup->has_value() && waiver(*backup, f.backup) != ours) return ours;
  }
  return "";
}

bool plan_install(Run& r, const InstallState& state, InstallPlan& plan) {
  const HostFs& host = r.env.host;
  // The shim: readable and an executable, or nothing is done.
  auto target = planned_binary_target(r.opt.binary);
  if (!target) return r.failed("runtime binary", target.error().message);
  plan.binary_target = *target;
  plan.previous_link = binary_link_target(host, r.opt.binary.link);
  plan.target_existed = host.exists(*target);

  auto rc = read_host(host, r.opt.runtime_config);
  if (!rc) return r.failed("runtime config", rc.error().message);
  plan.create_runtime_config = !rc->has_value();

  if (r.opt.cdi == CdiMode::generate && r.env.cdi_spec) {
    auto text = r.env.cdi_spec(r.opt.binary.link);
    if (!text) return r.failed("CDI spec", text.error().message);
    auto existing = read_host(host, r.opt.cdi_output);
    if (!existing) return r.failed("CDI spec", existing.error().message);
    if (!existing->has_value() || **existing != *text) {
      plan.cdi_text = *text;
      plan.cdi_old = *existing;
      bool recorded = state.cdi_spec && state.cdi_spec->path == r.opt.cdi_output;
      if (existing->has_value() && !recorded) {
        plan.cdi_backup = cdi_backup_path(host, r.opt.cdi_output, **existing);
      }
    }
  }

  // The handler in containerd's config, through `setup containerd`'s planner, on host paths.
  SetupOptions so;
  so.distribution = r.layout.distribution;
  so.config_path = r.layout.config_path;
  so.runtime_name = r.opt.runtime_name;
  so.binary = r.opt.binary.link;  // the host path containerd will exec
  so.version = r.opt.config_version;
  // What the node runs, when its containerd answers: the version a new file is written in, and
  // the template k3s renders.
  std::optional<std::string> release_text;
  if (auto release =
          r.env.probe.runtime_version(host.resolve(r.layout.socket).string(), milliseconds(2000))) {
    release_text = *release;
    so.node_version = config_version_of_release(*release);
    if (so.node_version)
      r.report.notes.push_back(
          cat("the running containerd is ", *release, " (config version ", *so.node_version, ")"));
  }
  // Where the allocation is enforced: the handler, gpufence-nri, or both (docs/install.md,
  // "Enforcement"). k3s/rke2 render containerd's config from a template and k0s generates its
  // own: gpufence adds only the handler there, not NRI's settings.
  const ConfigSource source = distribution_row(r.layout.distribution).config_source;
  auto choice = choose_enforcement(
      r.opt.enforcement, release_text,
      source == ConfigSource::go_template || source == ConfigSource::drop_in_dir);
  if (!choice) return r.failed("enforcement", choice.error().message);
  r.choice = *choice;
  r.report.enforcement = choice->mode;
  r.step("enforcement", Outcome::unchanged, choice->reason);
  so.handler = uses_handler(choice->mode) ? HandlerEdit::write : HandlerEdit::skip;
  if (choice->mode == Enforcement::nri)
    r.report.notes.push_back(cat("no runtime handler '", r.opt.runtime_name,
                                 "' in this mode: pods naming a RuntimeClass with that handler "
                                 "fail to start (--enforcement both keeps it)"));
  if (uses_nri(choice->mode)) {
    // gpufence-nri as containerd launches it: the binary beside the shim, and the NN-name link
    // in plugin_path (containerd refuses a name without the two-digit index).
    auto nri_target = planned_binary_target(r.opt.nri_binary);
    if (!nri_target) return r.failed("nri plugin", nri_target.error().message);
    plan.nri = true;
    plan.nri_target = *nri_target;
    plan.nri_previous_link = binary_link_target(host, r.opt.nri_binary.link);
    plan.nri_target_existed = host.exists(*nri_target);
    plan.nri_plugin_link =
        cat(r.opt.nri_plugin_path, "/", r.opt.nri_plugin_index, "-", r.opt.nri_plugin_name);
    plan.nri_plugin_before = binary_link_target(host, plan.nri_plugin_link);
    // containerd >= 2.2 (validators): the fence, the same binary under its own NN-name.
    if (choice->required_plugins) {
      plan.nri_fence_link =
          cat(r.opt.nri_plugin_path, "/", r.opt.nri_fence_index, "-", r.opt.nri_fence_name);
      plan.nri_fence_before = binary_link_target(host, plan.nri_fence_link);
    }
    // Someone else's file or link under either name is theirs: refused, nothing changed.
    for (const auto& [link, before] : {std::pair{plan.nri_plugin_link, plan.nri_plugin_before},
                                       std::pair{plan.nri_fence_link, plan.nri_fence_before}})
      if (!link.empty() && host.stat(link) && before != r.opt.nri_binary.link)
        return r.failed("nri plugin", cat(link, " exists and is not a link to ",
                                          r.opt.nri_binary.link, "; left alone"));
    r.report.nri_socket = r.opt.nri_socket;
    so.nri.enable = true;
    // install configures containerd; gpufence-nri itself runs beside it (docs/nri.md,
    // "Running it": a systemd unit, or containerd's plugin_path).
    if (choice->required_plugins) {
      so.nri.required_plugins = {r.opt.nri_plugin_name, r.opt.nri_fence_name};
      so.nri.tolerate_annotation = r.opt.nri_tolerate_annotation;
      so.nri.earlier_tolerate_annotation = earlier_waiver(host, state);
      r.report.notes.push_back(
          cat("containerd now refuses every container while ", r.opt.nri_plugin_name, " or ",
              r.opt.nri_fence_name, " is not connected (required_plugins), ",
              r.opt.nri_tolerate_annotation.empty()
                  ? std::string("with no waiver")
                  : cat("except pods annotated ", r.opt.nri_tolerate_annotation,
                        "=true (also as KEY/pod or KEY/container.NAME): a waiver any pod can set "
                        "unless an admission policy forbids it"),
              "; containerd launches both from ", r.opt.nri_plugin_path, " (docs/nri.md)"));
      if (!so.nri.earlier_tolerate_annotation.empty() &&
          so.nri.earlier_tolerate_annotation != r.opt.nri_tolerate_annotation)
        r.report.notes.push_back(
            cat("takes out the waiver an earlier install wrote: "
                "tolerate_missing_plugins_annotation = \"",
                escape_text(so.nri.earlier_tolerate_annotation), "\""));
    } else {
      r.report.notes.push_back(
          cat("GPU pods without the handler are isolated only while ", r.opt.nri_plugin_name,
              " runs (no required_plugins before containerd 2.2): "
              "`gpufence doctor` reports the gap; no ",
              r.opt.nri_fence_name, " either (containerd has no validators before 2.2)"));
    }
  }
  ReadFile read = [&host](const std::string& path) { return read_host(host, path); };
  // k3s renders runtimes of its own for the binaries it finds (setup avoids their names).
  IsExecutable executable = [&host](const std::string& path) {
    auto info = host.stat(path);
    return info &&
           (info->type == FileType::symlink ||
            (info->type != FileType::directory && ::access(host.resolve(path).c_str(), X_OK) == 0));
  };
  auto config = plan_containerd_setup(so, read, executable);
  if (!config) return r.failed("containerd config", config.error().message);
  plan.config = std::move(*config);
  r.layout.config_path = plan.config.config_path;
  r.report.config_path = r.layout.config_path;
  // What setup saw already wrong in the file (left alone) is worth a line; its advice to
  // restart is not: install restarts containerd itself.
  for (const auto& note : plan.config.notes) {
    if (note.starts_with("restart ")) continue;
    r.report.notes.push_back(note);
  }
  // The RuntimeClass names the handler install was asked for: one setup had to rename (k3s
  // renders a runtime of that name itself) would send GPU pods to a runtime that is not ours.
  if (plan.config.handler_name != r.opt.runtime_name)
    return r.failed("containerd config",
                    cat(r.layout.config_path, ": handler '", r.opt.runtime_name,
                        "' is taken on this node (setup would name it '", plan.config.handler_name,
                        "'); pick another --runtime-name and the RuntimeClass handler to match"));
  // gpufence's own files (k0s's drop-in) are refused here, before anything changes, where a
  // link would decide where root writes (checked again at the write).
  for (const auto& c : plan.config.changes) {
    if (c.links != LinkPolicy::refuse) continue;
    if (auto st = check_own_file_path(host, c.path); !st)
      return r.failed("containerd config", st.error().message);
  }
  // k0s merges every drop-in of its directory into one CRI table: the handler's name must be
  // gpufence's alone there.
  if (distribution_row(r.layout.distribution).config_source == ConfigSource::drop_in_dir) {
    if (auto st = check_k0s_runtime_name(host, plan.config.config_path, r.opt.runtime_name); !st)
      return r.failed("containerd config", st.error().message);
  }
  // A file an earlier install already wrote keeps that install's backup (the user's bytes).
  plan.backups = choose_backup_paths(plan.config, host);
  for (size_t i = 0; i < plan.config.changes.size(); ++i) {
    const auto& path = plan.config.changes[i].path;
    if (state.config_changed && state.config_path == r.layout.config_path &&
        std::any_of(state.config_files.begin(), state.config_files.end(),
                    [&](const InstallState::ManagedFile& f) { return f.path == path; }))
      plan.backups[i].clear();
  }

  for (const std::string& p :
       {r.opt.state_file, r.opt.binary.link, plan.binary_target, r.opt.runtime_config})
    missing_parents(host, p, plan.new_dirs);
  if (plan.cdi_text) missing_parents(host, r.opt.cdi_output, plan.new_dirs);
  if (plan.nri)
    for (const std::string& p : {r.opt.nri_binary.link, plan.nri_target, plan.nri_plugin_link})
      missing_parents(host, p, plan.new_dirs);
  if (!plan.nri_fence_link.empty()) missing_parents(host, plan.nri_fence_link, plan.new_dirs);
  for (const auto& c : plan.config.changes) missing_parents(host, c.path, plan.new_dirs);
  return true;
}

// The journal: the record as it will be, with every text this run is about to write.
InstallState journal_for(const Run& r, const InstallState& state, const InstallPlan& plan) {
  InstallState j = state;
  j.phase = "installing";
  j.steps = {"journal"};
  j.distribution = r.report.distribution;
  j.runtime_name = r.opt.runtime_name;
  j.socket = r.layout.socket;
  j.restart = r.layout.restart;
  j.enforcement = std::string(enforcement_name(r.choice.mode));
  j.nri_socket = uses_nri(r.choice.mode) ? r.opt.nri_socket : std::string();
  j.binary_link = r.opt.binary.link;
  j.versions_dir = r.opt.binary.versions_dir;
  if (plan.nri) {
    j.nri_binary_link = r.opt.nri_binary.link;
    j.nri_plugin_link = plan.nri_plugin_link;
    if (!plan.nri_fence_link.empty()) j.nri_fence_link = plan.nri_fence_link;
  }
  for (const auto& d : plan.new_dirs)
    if (!contains(j.created_dirs, d)) j.created_dirs.push_back(d);
  if (plan.create_runtime_config && !j.runtime_config_path) {
    j.runtime_config_path = r.opt.runtime_config;
    j.runtime_config_written = std::string(kDefaultRuntimeToml);
  }
  if (plan.cdi_text) {
    if (j.cdi_spec && j.cdi_spec->path == r.opt.cdi_output) {
      j.cdi_spec->written.push_back(*plan.cdi_text);
    } else {
      j.cdi_spec = InstallState::ManagedFile{
          r.opt.cdi_output, plan.cdi_old.has_value(), plan.cdi_backup, {*plan.cdi_text}};
    }
  }
  if (!plan.config.changes.empty()) {
    // A second install that changes the config again keeps the first one's record of each file
    // (was it there, its backup: the user's text), so uninstall still restores the file as it
    // was before any install.
    if (!j.config_changed || j.config_path != r.layout.config_path) j.config_files.clear();
    j.config_path = r.layout.config_path;
    j.config_changed = true;
    for (size_t i = 0; i < plan.config.changes.size(); ++i) {
      const auto& c = plan.config.changes[i];
      auto known =
          std::find_if(j.config_files.begin(), j.config_files.end(),
                       [&](const InstallState::ManagedFile& f) { return f.path == c.path; });
      if (known == j.config_files.end())
        j.config_files.push_back({c.path, c.existed, plan.backups[i], {c.new_text}});
      else
        known->written.push_back(c.new_text);
    }
  } else if (j.config_path != r.layout.config_path) {
    // Already configured before any install of ours: uninstall leaves it alone.
    j.config_path = r.layout.config_path;
    j.config_changed = false;
    j.config_files.clear();
  }
  return j;
}

bool save_state(Run& r, const InstallState& state) {
  std::string text = install_state_to_json(state);
  auto existing = read_host(r.env.host, r.opt.state_file);
  if (existing && existing->has_value() && **existing == text) return true;
  if (auto st = write_host(r.env.host, r.opt.state_file, text); !st)
    return r.failed("state", st.error().message);
  return true;
}

// Records a finished step in the journal.
bool record(Run& r, InstallState& journal, std::string step) {
  journal.steps.push_back(step);
  if (!save_state(r, journal)) return false;
  if (r.env.checkpoint) r.env.checkpoint(step);
  return true;
}

// ---- install: the steps ----

// A Kubernetes namespace name (RFC 1123 label).
bool is_namespace_name(std::string_view s) {
  return !s.empty() && s.size() <= 63 && s.front() != '-' && s.back() != '-' &&
         std::ranges::all_of(s, [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
         });
}

// deploy/runtime.toml, with the driver's NVML named when it is not on the host's library path.
Result<std::string> runtime_config_text(const std::string& nvml_library,
                                        const std::string& node_agent_namespace,
                                        const std::vector<std::string>& gpu_cdi_kinds) {
  std::string text(kDefaultRuntimeToml);
  if (!gpu_cdi_kinds.empty()) {
    // CDI kinds are vendor/class of [A-Za-z0-9._-] (the CLI checks the grammar): nothing a TOML
    // basic string would need to escape.
    std::string list;
    for (const auto& kind : gpu_cdi_kinds) {
      bool plain = !kind.empty() && std::ranges::all_of(kind, [](unsigned char c) {
        return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/';
      });
      if (!plain)
        return fail(Errc::invalid_argument, "the CDI kind '", escape_excerpt(kind),
                    "' is not vendor/class");
      list += cat(list.empty() ? "" : ", ", "\"", kind, "\"");
    }
    constexpr std::string_view key = "\ngpu_kinds = []\n";
    auto at = text.find(key);
    if (at == std::string::npos)
      return fail(Errc::internal, "deploy/runtime.toml has no empty gpu_kinds line");
    text.replace(at, key.size(), cat("\ngpu_kinds = [", list, "]\n"));
  }
  if (!node_agent_namespace.empty()) {
    if (!is_namespace_name(node_agent_namespace))
      return fail(Errc::invalid_argument, "the node agent namespace '",
                  escape_excerpt(node_agent_namespace), "' is not a Kubernetes namespace name");
    constexpr std::string_view key = "\nnode_agent_namespaces = []\n";
    auto at = text.find(key);
    if (at == std::string::npos)
      return fail(Errc::internal, "deploy/runtime.toml has no empty node_agent_namespaces line");
    text.replace(at, key.size(),
                 cat("\nnode_agent_namespaces = [\"", node_agent_namespace, "\"]\n"));
  }
  if (nvml_library.empty()) return text;
  if (!nvml_library.starts_with("/") || std::ranges::any_of(nvml_library, [](unsigned char c) {
        return c < 0x20 || c == '"' || c == '\\' || c == 0x7f;
      }))
    return fail(Errc::invalid_argument, "the NVML library path '", escape_excerpt(nvml_library),
                "' is not an absolute path a TOML basic string holds as is");
  constexpr std::string_view key = "\nnvml_library = \"\"\n";
  auto at = text.find(key);
  if (at == std::string::npos)
    return fail(Errc::internal, "deploy/runtime.toml has no empty nvml_library line to fill");
  text.replace(at, key.size(), cat("\nnvml_library = \"", nvml_library, "\"\n"));
  return text;
}

bool put_runtime_config(Run& r, const InstallPlan& plan, const InstallState& journal) {
  if (!plan.create_runtime_config) {
    bool ours = journal.runtime_config_written &&
                read_host(r.env.host, r.opt.runtime_config).value_or(std::nullopt) ==
                    journal.runtime_config_written;
    r.step("runtime config", Outcome::unchanged,
           cat(r.opt.runtime_config, ours ? " (written by an earlier install)" : " (kept as is)"));
    if (!r.opt.gpu_cdi_kinds.empty())
      r.report.notes.push_back(cat(r.opt.runtime_config, " exists and is kept: the GPU CDI kinds ",
                                   join(r.opt.gpu_cdi_kinds, ", "),
                                   " are not written; list them in its [cdi] gpu_kinds"));
    return true;
  }
  auto text =
      runtime_config_text(r.opt.nvml_library, r.opt.node_agent_namespace, r.opt.gpu_cdi_kinds);
  if (!text) return r.failed("runtime config", text.error().message);
  if (auto st = write_host(r.env.host, r.opt.runtime_config, *text); !st)
    return r.failed("runtime config", st.error().message);
  r.step("runtime config", Outcome::changed,
         cat(r.opt.runtime_config, " (defaults",
             r.opt.nvml_library.empty() ? "" : cat("; nvml_library ", r.opt.nvml_library), ")"));
  return true;
}

// The plugin_path links and where they lead, for the report.
std::string nri_plugin_text(const Run& r, const InstallPlan& plan) {
  return cat(plan.nri_plugin_link,
             plan.nri_fence_link.empty() ? std::string() : cat(", ", plan.nri_fence_link), " -> ",
             r.opt.nri_binary.link, " -> ", plan.nri_target);
}

// Step: gpufence-nri beside the shim (the same atomic link swap), started once on the host, then
// linked into containerd's plugin_path (the decider, and on containerd >= 2.2 the fence), from
// where containerd launches it at its next start.
bool put_nri_plugin(Run& r, const InstallPlan& plan) {
  if (!plan.nri) return true;
  auto done = install_binary(r.env.host, r.opt.nri_binary);
  if (!done) return r.failed("nri plugin", done.error().message);
  for (const auto& p : done->pruned) r.report.notes.push_back("removed old version " + p);
  std::string path = r.opt.host_exec == HostExec::nsenter
                         ? r.opt.nri_binary.link
                         : r.env.host.resolve(done->target).string();
  auto argv = host_command(r.opt.host_exec, {path, "--help"}, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return r.failed("nri plugin", res.error().message);
  if (res->exit_code != 0)
    return r.failed("nri plugin", cat(r.opt.nri_binary.link, " does not run on this host (`",
                                      shell_words(argv), "` exited ", res->exit_code, ": ",
                                      trim(res->out), "); containerd's config is left as it was"));
  bool changed = done->changed == Changed::yes;
  for (const auto& [link, before] : {std::pair{plan.nri_plugin_link, plan.nri_plugin_before},
                                     std::pair{plan.nri_fence_link, plan.nri_fence_before}}) {
    if (link.empty() || before == r.opt.nri_binary.link) continue;
    if (auto st = point_binary_link(r.env.host, link, r.opt.nri_binary.link); !st)
      return r.failed("nri plugin", st.error().message);
    changed = true;
  }
  r.step("nri plugin", changed ? Outcome::changed : Outcome::unchanged, nri_plugin_text(r, plan));
  return true;
}

bool put_cdi_spec(Run& r, const InstallPlan& plan) {
  if (r.opt.cdi == CdiMode::skip || !r.env.cdi_spec) {
    r.step("CDI spec", Outcome::skipped, "--cdi skip");
    return true;
  }
  if (!plan.cdi_text) {
    r.step("CDI spec", Outcome::unchanged, r.opt.cdi_output);
    return true;
  }
  if (!plan.cdi_backup.empty()) {
    auto b = write_backup_exclusive(
        r.env.host.resolve(r.opt.cdi_output), *plan.cdi_old,
        plan.cdi_backup.substr(r.opt.cdi_output.size() + std::string_view(".bak-").size()));
    if (!b) return r.failed("CDI spec", b.error().message);
  }
  if (auto st = write_host(r.env.host, r.opt.cdi_output, *plan.cdi_text); !st)
    return r.failed("CDI spec", st.error().message);
  r.step("CDI spec", Outcome::changed,
         plan.cdi_backup.empty() ? r.opt.cdi_output
                                 : cat(r.opt.cdi_output, " (backup ", plan.cdi_backup, ")"));
  return true;
}

// What the config already has, in the words of the chosen mode.
std::string already_configured(const Run& r) {
  std::string what;
  if (uses_handler(r.choice.mode)) what = "runtime " + r.opt.runtime_name;
  if (uses_nri(r.choice.mode))
    what += cat(what.empty() ? "" : " and ", "NRI on",
                r.choice.required_plugins
                    ? cat(", requiring ", r.opt.nri_plugin_name, " and ", r.opt.nri_fence_name)
                    : "");
  return cat(r.layout.config_path, " already has ", what);
}

bool edit_containerd_config(Run& r, const InstallPlan& plan) {
  if (plan.config.changes.empty()) {
    r.step("containerd config", Outcome::unchanged, already_configured(r));
    return true;
  }
  if (auto st = apply_setup_plan_with(plan.config, r.env.host, plan.backups); !st)
    return r.failed("containerd config",
                    cat(st.error().message, "; the previous config is left in place"));
  for (size_t i = 0; i < plan.config.changes.size(); ++i) {
    const auto& c = plan.config.changes[i];
    r.step("containerd config", Outcome::changed,
           cat(c.path, !c.existed                ? std::string(" (created)")
                       : plan.backups[i].empty() ? std::string(" (updated)")
                                                 : cat(" (backup ", plan.backups[i], ")")));
  }
  return true;
}

Result<std::vector<LoadedRuntime>> probe_once(const Run& r, milliseconds timeout) {
  return r.env.probe.loaded_runtimes(r.env.host.resolve(r.layout.socket).string(), timeout);
}

// Polls the CRI socket until containerd answers or the ready timeout passes.
Result<std::vector<LoadedRuntime>> wait_ready(const Run& r) {
  auto deadline = r.env.now() + r.opt.ready_timeout;
  Error last{Errc::rpc, "no answer"};
  while (true) {
    auto got = probe_once(r, milliseconds(2000));
    if (got) return got;
    last = got.error();
    if (r.env.now() >= deadline) break;
    r.env.sleep(milliseconds(250));
  }
  return fail(last.code, "containerd did not answer on ", r.layout.socket, " within ",
              r.opt.ready_timeout.count() / 1000.0, "s: ", last.message);
}

bool has_handler(const std::vector<LoadedRuntime>& loaded, const std::string& name,
                 const std::string& binary) {
  return std::any_of(loaded.begin(), loaded.end(), [&](const LoadedRuntime& l) {
    return l.name == name && l.binary_name == binary;
  });
}

// What, in the handler the running containerd loaded, would make gpufence-runtime not run or
// trust what a pod wrote (the doctor's containerd.handler-bypasses-binary and
// containerd.pod-annotations-cdi), judged on CRI status: containerd merges every file it imports
// into one table, so another drop-in's keys land in gpufence's handler even when install's own
// file is right. nullopt when there is none.
std::optional<std::string> handler_weakness(const std::vector<LoadedRuntime>& loaded,
                                            const std::string& name) {
  for (const auto& l : loaded) {
    if (l.name != name) continue;
    if (!is_runc_shim_type(l.runtime_type))
      return cat("its runtime_type is \"", escape_text(l.runtime_type),
                 "\", so BinaryName is never run");
    if (!l.runtime_path.empty())
      return cat(
          "its runtime_path \"", escape_text(l.runtime_path),
          "\" makes containerd start that shim instead of runc's, so BinaryName is never run");
    for (const auto& pattern : l.pod_annotations)
      if (pod_annotation_pattern_admits_cdi(pattern))
        return cat("its pod_annotations pattern \"", escape_text(pattern),
                   "\" copies a pod's cdi.k8s.io/ annotations into its containers' specs: any pod "
                   "could name devices the kubelet never allocated");
  }
  return std::nullopt;
}

// The verify failure for such a handler: where its keys come from is another file.
std::string weakness_text(const Run& r, const std::string& why) {
  return cat("containerd at ", r.layout.socket, " loaded runtime ", r.opt.runtime_name, ", but ",
             why, ". The key comes from a file containerd merges into ", r.layout.config_path,
             " (an import or drop-in): remove it there (`gpufence setup check-containerd` names "
             "it), or choose another --runtime-name");
}

bool nri_listening(const Run& r) {
  // Through the host's own links (/var/run -> /run): under --host-root /host the plain join
  // /host/var/run/... would follow /var/run's absolute link into this container's /run.
  auto sock = r.env.host.socket_path(r.opt.nri_socket);
  return sock && r.env.probe.nri_listening(sock->path);
}

// The running containerd enforces what the chosen mode needs: the handler, NRI's socket.
bool enforced(const Run& r, const std::vector<LoadedRuntime>& loaded) {
  if (uses_handler(r.choice.mode) && !has_handler(loaded, r.opt.runtime_name, r.opt.binary.link))
    return false;
  return !uses_nri(r.choice.mode) || nri_listening(r);
}

std::string enforced_text(const Run& r) {
  std::string out;
  if (uses_handler(r.choice.mode))
    out = cat("containerd runs handler ", r.opt.runtime_name, " -> ", r.opt.binary.link);
  if (uses_nri(r.choice.mode))
    out += cat(out.empty() ? "containerd" : ";", " listens on NRI socket ", r.opt.nri_socket);
  return out;
}

Status restart_containerd(Run& r) {
  r.restart_attempted = true;
  auto argv = host_command(r.opt.host_exec, r.layout.restart, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return std::unexpected(res.error());
  if (res->exit_code != 0)
    return fail(Errc::io, "`", shell_words(argv), "` exited ", res->exit_code, ": ",
                trim(res->out));
  r.report.restarted = true;
  return {};
}

// After a failed step: every file this run wrote back as it was (the last written first), the
// record as it was before this run (none, for a first install), and containerd restarted on the
// previous config when this run had changed it. Nothing this run created is left behind.
void undo_run(Run& r, const InstallPlan& plan, const InstallState& prior, bool had_state,
              bool config_written) {
  const HostFs& host = r.env.host;
  bool ok = true;
  auto note_fail = [&](const std::string& what, const Error& e) {
    ok = false;
    r.report.notes.push_back(cat("ROLLBACK FAILED: ", what, ": ", e.message));
  };
  // Only the files this run did write (a write that failed half-way, as a read-only root file,
  // left the rest as it was): their backups go with them.
  bool restored_config = false;
  if (config_written) {
    for (size_t i = plan.config.changes.size(); i-- > 0;) {
      const auto& c = plan.config.changes[i];
      auto cur = read_host(host, c.path);
      bool written = cur && cur->has_value() && **cur == c.new_text;
      if (!written) {
        if (cur && cur->value_or("") == c.old_text) unlink_host(host, plan.backups[i]);
        continue;
      }
      Status st = c.existed
                      ? (c.links == LinkPolicy::refuse ? write_own_file(host, c.path, c.old_text)
                                                       : write_host(host, c.path, c.old_text))
                      : (::unlink(host.resolve(c.path).c_str()) == 0 || errno == ENOENT
                             ? Status{}
                             : fail_errno("unlink", c.path));
      if (!st) {
        note_fail(
            cat("restore ", c.path,
                plan.backups[i].empty() ? std::string()
                                        : cat(" (the user's bytes are in ", plan.backups[i], ")")),
            st.error());
        continue;
      }
      restored_config = true;
      unlink_host(host, plan.backups[i]);
      r.report.notes.push_back(c.existed ? cat("restored the previous ", c.path)
                                         : cat("removed ", c.path, " (install created it)"));
    }
  }
  if (plan.cdi_text) {
    auto cur = read_host(host, r.opt.cdi_output);
    if (cur && cur->has_value() && **cur == *plan.cdi_text) {
      if (plan.cdi_old)
        (void)write_host(host, r.opt.cdi_output, *plan.cdi_old);
      else
        unlink_host(host, r.opt.cdi_output);
    }
    unlink_host(host, plan.cdi_backup);
  }
  if (plan.create_runtime_config) {
    auto cur = read_host(host, r.opt.runtime_config);
    if (cur && cur->has_value() && **cur == kDefaultRuntimeToml)
      unlink_host(host, r.opt.runtime_config);
  }
  if (binary_link_target(host, r.opt.binary.link) == plan.binary_target) {
    if (plan.previous_link) {
      if (auto st = point_binary_link(host, r.opt.binary.link, *plan.previous_link); !st)
        note_fail("point " + r.opt.binary.link + " back", st.error());
    } else {
      unlink_host(host, r.opt.binary.link);
    }
  }
  if (!plan.target_existed) unlink_host(host, plan.binary_target);
  if (plan.nri) {
    for (const auto& [link, before] : {std::pair{plan.nri_plugin_link, plan.nri_plugin_before},
                                       std::pair{plan.nri_fence_link, plan.nri_fence_before}})
      if (!link.empty() && !before && binary_link_target(host, link) == r.opt.nri_binary.link)
        unlink_host(host, link);
    if (binary_link_target(host, r.opt.nri_binary.link) == plan.nri_target) {
      if (plan.nri_previous_link) {
        if (auto st = point_binary_link(host, r.opt.nri_binary.link, *plan.nri_previous_link); !st)
          note_fail("point " + r.opt.nri_binary.link + " back", st.error());
      } else {
        unlink_host(host, r.opt.nri_binary.link);
      }
    }
    if (!plan.nri_target_existed) unlink_host(host, plan.nri_target);
  }
  if (had_state) {
    save_state(r, prior);
  } else {
    unlink_host(host, r.opt.state_file);
  }
  remove_created_dirs(host, plan.new_dirs);
  if (ok) r.report.notes.push_back("this run's files are taken back");
  // containerd read the config only if this run restarted it (or tried to).
  if (!restored_config || !r.restart_attempted) return;
  if (auto rs = restart_containerd(r); !rs) {
    r.report.notes.push_back("restart after rollback failed: " + rs.error().message);
  } else if (auto ready = wait_ready(r); !ready) {
    r.report.notes.push_back("after rollback: " + ready.error().message);
  } else {
    r.report.notes.push_back("containerd is running again on the previous config");
  }
}

}  // namespace

std::string_view outcome_name(Outcome o) {
  switch (o) {
    case Outcome::changed:
      return "changed";
    case Outcome::unchanged:
      return "ok";
    case Outcome::skipped:
      return "skipped";
    case Outcome::failed:
      return "FAILED";
  }
  return "?";
}

bool InstallReport::changed_anything() const {
  return restarted || std::any_of(steps.begin(), steps.end(), [](const InstallStep& s) {
           return s.outcome == Outcome::changed;
         });
}

Result<bool> handler_loaded(const InstallEnv& env, const std::string& socket,
                            const std::string& runtime_name, const std::string& binary,
                            milliseconds timeout) {
  auto loaded = env.probe.loaded_runtimes(env.host.resolve(socket).string(), timeout);
  if (!loaded) return std::unexpected(loaded.error());
  return has_handler(*loaded, runtime_name, binary);
}

bool nri_enabled(const InstallEnv& env, const std::string& nri_socket) {
  return env.probe.nri_listening(env.host.resolve(nri_socket).string());
}

namespace {

// One run under the node's install lock (install/lock.hpp), taken before the record is read and
// held until the report is done. A run that cannot get it in time changes nothing.
template <class Body>
InstallReport under_lock(std::string_view command, const InstallOptions& opt, const InstallEnv& env,
                         Body body) {
  LockWait wait{opt.lock_timeout, env.sleep, env.now, env.progress};
  auto lock = InstallLock::acquire(env.host, install_lock_path(opt.state_file), wait);
  if (!lock) {
    InstallReport report;
    report.command = std::string(command);
    report.steps.push_back({"lock", Outcome::failed, lock.error().message});
    report.failure = "lock: " + lock.error().message;
    return report;
  }
  std::vector<std::string> dirs_after;  // to remove once the lock file is gone
  InstallReport report = body(*lock, dirs_after);
  if (lock->waited().count() > 0)
    report.notes.insert(report.notes.begin(),
                        cat("waited ", lock->waited().count() / 1000.0, " s for another run",
                            lock->waited_for() ? cat(" (pid ", *lock->waited_for(), ")") : "",
                            " to finish (", lock->path(), ")"));
  lock->release(!env.host.stat(opt.state_file), dirs_after);
  return report;
}

InstallReport install_locked(const InstallOptions& opt, const InstallEnv& env,
                             const InstallLock& lock) {
  InstallReport report;
  report.command = "install";
  auto started = env.now();
  Run r{opt, env, report, {}, {}, false, {}};
  auto finish = [&] {
    report.elapsed = std::chrono::duration_cast<milliseconds>(env.now() - started);
    return report;
  };
  auto previous = load_state(env.host, opt.state_file);
  if (!previous) {
    r.failed("state", previous.error().message);
    return finish();
  }
  const bool had_state = !previous->binary_link.empty();
  InstallState prior = *previous;
  if (had_state && prior.phase == "installing")
    report.notes.push_back(cat(opt.state_file, ": an earlier install stopped after step '",
                               prior.steps.empty() ? std::string("?") : prior.steps.back(),
                               "'; this run finishes it"));

  // Plan: where containerd keeps its config and socket, and everything that will change. A
  // refusal here changes nothing on the host.
  if (!find_layout(r)) return finish();
  InstallState state = prior;
  if (had_state) remove_stale_temps(env.host, prior, opt.state_file);
  if (auto st = forget_what_is_the_users(env.host, state); !st) {
    r.failed("state", st.error().message);
    return finish();
  }
  InstallPlan plan;
  // The directories made for the lock file are this install's too: recorded, so uninstall
  // takes them back.
  plan.new_dirs = lock.made_dirs();
  if (!plan_install(r, state, plan)) return finish();

  // Nothing to write (a second install): no journal either, only the running containerd's check.
  const bool nothing_to_write =
      had_state && prior.phase == "installed" && plan.previous_link == plan.binary_target &&
      plan.target_existed && !plan.create_runtime_config && !plan.cdi_text &&
      plan.config.changes.empty() && state.config_path == r.layout.config_path &&
      prior.enforcement == enforcement_name(r.choice.mode) &&
      (!plan.nri || (plan.nri_previous_link == plan.nri_target && plan.nri_target_existed &&
                     plan.nri_plugin_before == opt.nri_binary.link &&
                     prior.nri_plugin_link == plan.nri_plugin_link)) &&
      (plan.nri_fence_link.empty() || (plan.nri_fence_before == opt.nri_binary.link &&
                                       prior.nri_fence_link == plan.nri_fence_link));
  // Journal first: the record names every file and directory before any of them changes.
  InstallState journal = journal_for(r, state, plan);
  if (nothing_to_write) {
    journal = prior;
    journal.steps = {"journal"};
  }
  if (nothing_to_write) {
    // Only the pieces that are already in place: report them as such.
    r.step("runtime binary", Outcome::unchanged, cat(opt.binary.link, " -> ", plan.binary_target));
    if (plan.nri) r.step("nri plugin", Outcome::unchanged, nri_plugin_text(r, plan));
    r.step("runtime config", Outcome::unchanged, opt.runtime_config + " (kept as is)");
    r.step("CDI spec", opt.cdi == CdiMode::skip ? Outcome::skipped : Outcome::unchanged,
           opt.cdi == CdiMode::skip ? std::string("--cdi skip") : opt.cdi_output);
    r.step("containerd config", Outcome::unchanged, already_configured(r));
    auto now_loaded = probe_once(r, milliseconds(2000));
    if (now_loaded && enforced(r, *now_loaded)) {
      if (auto weak = uses_handler(r.choice.mode) ? handler_weakness(*now_loaded, opt.runtime_name)
                                                  : std::nullopt) {
        r.failed("verify", weakness_text(r, *weak));
        return finish();
      }
      r.step("restart", Outcome::unchanged, "not needed: containerd already runs it");
      r.step("verify", Outcome::unchanged, enforced_text(r));
      return finish();
    }
  }
  if (!save_state(r, journal)) {
    remove_created_dirs(env.host, plan.new_dirs);
    return finish();
  }
  if (env.checkpoint) env.checkpoint("journal");
  auto undo = [&](bool config_written) {
    undo_run(r, plan, prior, had_state, config_written);
    return finish();
  };

  // Step 1: the shim on the host first: the config about to name it must never dangle.
  if (!put_binary(r) || !smoke_test_binary(r)) return undo(false);
  if (!record(r, journal, "runtime binary")) return undo(false);
  // Step 1b (nri, both): gpufence-nri where containerd launches it, before the config requires it.
  if (!put_nri_plugin(r, plan)) return undo(false);
  if (plan.nri && !record(r, journal, "nri plugin")) return undo(false);
  // Step 2: its config, if the node has none.
  if (!put_runtime_config(r, plan, journal) || !record(r, journal, "runtime config"))
    return undo(false);
  // Step 3: the CDI spec the shim and containerd read device edits from.
  if (!put_cdi_spec(r, plan) || !record(r, journal, "CDI spec")) return undo(false);
  // Step 4: the handler in containerd's config (the user's bytes backed up first).
  if (!edit_containerd_config(r, plan)) return undo(true);
  if (!record(r, journal, "containerd config")) return undo(true);
  const bool changed = !plan.config.changes.empty();

  // Step 5: restart only when the config changed or the running containerd lacks the handler.
  bool loaded = false;
  if (!changed) {
    auto now_loaded = probe_once(r, milliseconds(2000));
    loaded = now_loaded && enforced(r, *now_loaded);
  }
  if (loaded) {
    r.step("restart", Outcome::unchanged, "not needed: containerd already runs it");
  } else {
    auto rs = restart_containerd(r);
    if (!rs) {
      r.failed("restart", rs.error().message);
      return undo(changed);
    }
    r.step("restart", Outcome::changed,
           shell_words(host_command(opt.host_exec, r.layout.restart, opt.host_pid)));
    if (!record(r, journal, "restart")) return undo(changed);
  }

  // Step 6: the running containerd, not the file, is the proof.
  auto running = wait_ready(r);
  if (!running) {
    r.failed("verify", running.error().message);
    return undo(changed);
  }
  if (uses_handler(r.choice.mode) && !has_handler(*running, opt.runtime_name, opt.binary.link)) {
    std::vector<std::string> names;
    for (const auto& l : *running) names.push_back(l.name);
    r.failed("verify", cat("containerd at ", r.layout.socket, " has no runtime ", opt.runtime_name,
                           " with BinaryName ", opt.binary.link, " (it has: ", join(names, ", "),
                           "); is ", r.layout.config_path, " the file it reads?"));
    return undo(changed);
  }
  if (auto weak = uses_handler(r.choice.mode) ? handler_weakness(*running, opt.runtime_name)
                                              : std::nullopt) {
    r.failed("verify", weakness_text(r, *weak));
    return undo(changed);
  }
  if (uses_nri(r.choice.mode)) {
    // containerd starts NRI after CRI answers: give it the rest of the ready timeout.
    auto deadline = env.now() + opt.ready_timeout;
    while (!nri_listening(r) && env.now() < deadline) env.sleep(milliseconds(250));
    if (!nri_listening(r)) {
      r.failed("verify",
               cat("containerd at ", r.layout.socket, " does not listen on the NRI socket ",
                   opt.nri_socket, "; is ", r.layout.config_path,
                   " the file it reads (and socket_path the "
                   "default)? --nri-socket names another"));
      return undo(changed);
    }
  }
  r.step("verify", Outcome::unchanged, enforced_text(r));
  // Installed: each file is install's in the text it holds now.
  journal.phase = "installed";
  for (auto& f : journal.config_files)
    if (f.written.size() > 1) f.written.erase(f.written.begin(), f.written.end() - 1);
  if (journal.cdi_spec && journal.cdi_spec->written.size() > 1)
    journal.cdi_spec->written.erase(journal.cdi_spec->written.begin(),
                                    journal.cdi_spec->written.end() - 1);
  record(r, journal, "verify");
  return finish();
}

InstallReport uninstall_locked(const InstallOptions& opt, const InstallEnv& env,
                               std::vector<std::string>& dirs_after) {
  InstallReport report;
  report.command = "uninstall";
  auto started = env.now();
  Run r{opt, env, report, {}, {}, false, {}};
  auto finish = [&] {
    report.elapsed = std::chrono::duration_cast<milliseconds>(env.now() - started);
    return report;
  };
  auto st = read_host(env.host, opt.state_file);
  if (!st) {
    r.failed("state", st.error().message);
    return finish();
  }
  if (!st->has_value()) {
    // An install killed while writing its very first record leaves only that record's
    // temporary file.
    remove_stale_temps(env.host, opt.state_file);
    dirs_after.push_back(fs::path(opt.state_file).parent_path().string());
    r.step("state", Outcome::unchanged, cat("no ", opt.state_file, ": nothing installed"));
    return finish();
  }
  auto parsed = parse_install_state(**st, opt.state_file);
  if (!parsed) {
    r.failed("state", parsed.error().message);
    return finish();
  }
  const InstallState& state = *parsed;
  report.distribution = state.distribution;
  report.config_path = state.config_path;
  report.socket = opt.socket.empty() ? state.socket : opt.socket;
  r.layout.config_path = state.config_path;
  r.layout.socket = report.socket;
  r.layout.restart = opt.restart_command.empty() ? state.restart : opt.restart_command;
  if (state.phase == "installing")
    report.notes.push_back(cat("the recorded install stopped after step '",
                               state.steps.empty() ? std::string("?") : state.steps.back(),
                               "': taking back what it did"));

  // Step 1: the config as it was before install, only if nobody edited any of its files since:
  // all of them are judged before the first is touched. A file that holds the user's bytes
  // already (never written, or restored by an uninstall that was stopped) needs nothing.
  bool restored = false;
  // k0s: the config files are gpufence's own drop-in, put back with no link followed.
  auto recorded = parse_distribution(state.distribution);
  const bool own_files =
      recorded && distribution_row(*recorded).config_source == ConfigSource::drop_in_dir;
  if (state.config_changed) {
    std::vector<Holds> holds;
    for (const auto& f : state.config_files) {
      auto h = classify(env.host, f);
      if (!h) {
        r.failed("containerd config", h.error().message);
        return finish();
      }
      if (*h == Holds::edited) {
        r.failed("containerd config",
                 cat(f.path, " was edited after install; left alone, as the rest of the config (",
                     f.existed ? "the pre-install file is " + f.backup
                               : std::string("it did not exist before install"),
                     ")"));
        return finish();
      }
      if (*h == Holds::backup_gone) {
        r.failed("containerd config",
                 cat("backup ", f.backup, " is gone; ", f.path, " left as it is"));
        return finish();
      }
      holds.push_back(*h);
    }
    for (size_t i = state.config_files.size(); i-- > 0;) {
      const auto& f = state.config_files[i];
      if (holds[i] == Holds::user) {
        r.step("containerd config", Outcome::unchanged, f.path + " holds the user's bytes");
        continue;
      }
      if (f.existed) {
        auto backup = read_backup(env.host, f.backup);
        Status w = !backup     ? Status(std::unexpected(backup.error()))
                   : own_files ? write_own_file(env.host, f.path, backup->value_or(""))
                               : write_host(env.host, f.path, backup->value_or(""));
        if (!w) {
          r.failed("containerd config", w.error().message);
          return finish();
        }
        r.step("containerd config", Outcome::changed, cat(f.path, " restored from ", f.backup));
      } else {
        if (::unlink(env.host.resolve(f.path).c_str()) != 0 && errno != ENOENT) {
          r.failed("containerd config", fail_errno("unlink", f.path).error().message);
          return finish();
        }
        r.step("containerd config", Outcome::changed, f.path + " removed (install created it)");
      }
      restored = true;
    }
  } else {
    r.step("containerd config", Outcome::unchanged,
           state.config_path + " had the handler before install: left alone");
  }

  // Step 2: containerd on the restored config, and proof the handler is gone. With nothing to
  // restore (an uninstall stopped after restoring), the running containerd still decides: one
  // that kept the handler is restarted.
  bool need_restart = restored;
  if (!restored && state.config_changed) {
    auto now = probe_once(r, milliseconds(2000));
    need_restart = now && std::any_of(now->begin(), now->end(), [&](const LoadedRuntime& l) {
                     return l.name == state.runtime_name && l.binary_name == state.binary_link;
                   });
  }
  if (need_restart) {
    if (auto rs = restart_containerd(r); !rs) {
      r.failed("restart", rs.error().message);
      return finish();
    }
    r.step("restart", Outcome::changed,
           shell_words(host_command(opt.host_exec, r.layout.restart, opt.host_pid)));
    auto running = wait_ready(r);
    if (!running) {
      r.failed("verify", running.error().message);
      return finish();
    }
    bool still = std::any_of(running->begin(), running->end(),
                             [&](const LoadedRuntime& l) { return l.name == state.runtime_name; });
    if (still) {
      r.failed("verify", cat("containerd still runs handler ", state.runtime_name,
                             " after the config was restored"));
      return finish();
    }
    r.step("verify", Outcome::unchanged,
           state.enforcement == "nri"
               ? cat("containerd answers again on the restored config (NRI as the user had it)")
               : "containerd no longer has handler " + state.runtime_name);
  }
  // The backups' text is the config again: the copies install made are no longer needed.
  for (const auto& f : state.config_files)
    if (f.existed) unlink_host(env.host, f.backup);

  // Step 3: the files install created or changed besides the config.
  if (state.cdi_spec) {
    const auto& f = *state.cdi_spec;
    auto h = classify(env.host, f);
    if (h && *h == Holds::ours) {
      auto backup =
          f.existed ? read_backup(env.host, f.backup) : Result<std::optional<std::string>>{};
      if (f.existed && backup && backup->has_value()) {
        (void)write_host(env.host, f.path, **backup);
        r.step("CDI spec", Outcome::changed, f.path + " restored from " + f.backup);
      } else if (!f.existed) {
        unlink_host(env.host, f.path);
        r.step("CDI spec", Outcome::changed, f.path + " removed");
      }
    } else if (h && *h == Holds::edited) {
      r.step("CDI spec", Outcome::unchanged, f.path + " edited since install: kept");
    }
    if (f.existed && (!h || *h != Holds::edited)) unlink_host(env.host, f.backup);
  }
  if (state.runtime_config_path) {
    auto current = read_host(env.host, *state.runtime_config_path);
    if (current && current->has_value() && **current == state.runtime_config_written) {
      ::unlink(env.host.resolve(*state.runtime_config_path).c_str());
      r.step("runtime config", Outcome::changed, *state.runtime_config_path + " removed");
    } else if (current && current->has_value()) {
      r.step("runtime config", Outcome::unchanged,
             *state.runtime_config_path + " edited since install: kept");
    }
  }
  remove_stale_temps(env.host, state, opt.state_file);
  // gpufence-nri: containerd runs on the restored config now, which no longer requires it.
  if (!state.nri_plugin_link.empty()) {
    std::vector<std::string> gone;
    for (const auto& link : {state.nri_plugin_link, state.nri_fence_link})
      if (!link.empty() && binary_link_target(env.host, link) == state.nri_binary_link &&
          ::unlink(env.host.resolve(link).c_str()) == 0)
        gone.push_back(link);
    BinaryInstallOptions nri_bin = opt.nri_binary;
    nri_bin.link = state.nri_binary_link;
    nri_bin.versions_dir = state.versions_dir;
    auto nri_removed = remove_binary(env.host, nri_bin);
    if (!nri_removed) {
      r.failed("nri plugin", nri_removed.error().message);
      return finish();
    }
    gone.insert(gone.end(), nri_removed->begin(), nri_removed->end());
    r.step("nri plugin", gone.empty() ? Outcome::unchanged : Outcome::changed,
           gone.empty() ? "nothing to remove" : join(gone, ", ") + " removed");
  }
  BinaryInstallOptions bin = opt.binary;
  bin.link = state.binary_link;
  bin.versions_dir = state.versions_dir;
  auto removed = remove_binary(env.host, bin);
  if (!removed) {
    r.failed("runtime binary", removed.error().message);
    return finish();
  }
  r.step("runtime binary", removed->empty() ? Outcome::unchanged : Outcome::changed,
         removed->empty() ? "nothing to remove" : join(*removed, ", ") + " removed");
  ::unlink(env.host.resolve(opt.state_file).c_str());
  remove_created_dirs(env.host, state.created_dirs);
  // The state directory holds the lock file until the run ends: removed after it, when empty.
  dirs_after = state.created_dirs;
  dirs_after.push_back(fs::path(opt.state_file).parent_path().string());
  return finish();
}

}  // namespace

InstallReport run_install(const InstallOptions& opt, const InstallEnv& env) {
  return under_lock("install", opt, env, [&](const InstallLock& lock, std::vector<std::string>&) {
    return install_locked(opt, env, lock);
  });
}

InstallReport run_uninstall(const InstallOptions& opt, const InstallEnv& env) {
  return under_lock("uninstall", opt, env,
                    [&](const InstallLock&, std::vector<std::string>& dirs_after) {
                      return uninstall_locked(opt, env, dirs_after);
                    });
}

std::string render_install_report(const InstallReport& report) {
  std::string out = cat("gpufence ", report.command);
  if (!report.distribution.empty()) out += cat(" (", report.distribution, ")");
  out += "\n";
  for (const auto& s : report.steps) {
    std::string name = s.name;
    name.resize(std::max<size_t>(name.size(), 18), ' ');
    out += cat("  ", name, " ", outcome_name(s.outcome), "  ", s.detail, "\n");
  }
  for (const auto& n : report.notes) out += cat("  note: ", n, "\n");
  if (report.failure) {
    out += cat("FAILED: ", *report.failure, "\n");
  } else {
    out += cat(report.command == "install" ? "installed" : "uninstalled", " in ",
               report.elapsed.count() / 1000.0, "s",
               report.changed_anything() ? "" : " (nothing to change)", "\n");
  }
  return out;
}

}  // namespace gpufence
