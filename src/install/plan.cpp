// install's plan: everything it will do, worked out before the first byte changes; and the
// journal recording each step as it is done (install/flow.hpp).
#include "install/flow.hpp"

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

namespace gpufence::install_flow {

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

}  // namespace gpufence::install_flow
