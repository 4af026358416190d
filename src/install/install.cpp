#include "install/install.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "containerd/setup.hpp"
#include "install/default_runtime_toml.hpp"
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
Result<std::optional<std::string>> read_host(const HostFs& host, const std::string& path) {
  auto text = host.read(path);
  if (text) return std::optional<std::string>(std::move(*text));
  if (text.error().code == Errc::not_found) return std::optional<std::string>{};
  return std::unexpected(text.error());
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
  r.layout = layout_for(d, r.env.host);
  if (!r.opt.config_path.empty()) r.layout.config_path = r.opt.config_path;
  if (!r.opt.socket.empty()) r.layout.socket = r.opt.socket;
  if (!r.opt.restart_command.empty()) r.layout.restart = r.opt.restart_command;
  r.report.distribution = std::string(distribution_name(d));
  r.report.config_path = r.layout.config_path;
  r.report.socket = r.layout.socket;
  r.step(
      "distribution", Outcome::unchanged,
      cat(distribution_name(d), ": config ", r.layout.config_path, ", socket ", r.layout.socket));
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

// Step: the shim's config, only when the node has none (a user's file is never replaced).
bool put_runtime_config(Run& r, InstallState& state) {
  auto existing = read_host(r.env.host, r.opt.runtime_config);
  if (!existing) return r.failed("runtime config", existing.error().message);
  if (existing->has_value()) {
    bool ours = state.runtime_config_written && **existing == *state.runtime_config_written;
    r.step("runtime config", Outcome::unchanged,
           cat(r.opt.runtime_config, ours ? " (written by an earlier install)" : " (kept as is)"));
    return true;
  }
  if (auto st = write_host(r.env.host, r.opt.runtime_config, kDefaultRuntimeToml); !st)
    return r.failed("runtime config", st.error().message);
  state.runtime_config_path = r.opt.runtime_config;
  state.runtime_config_written = std::string(kDefaultRuntimeToml);
  r.step("runtime config", Outcome::changed, r.opt.runtime_config + " (defaults)");
  return true;
}

// Step: the CDI spec for this node's GPUs, rewritten only when it differs.
bool put_cdi_spec(Run& r, InstallState& state) {
  if (r.opt.cdi == CdiMode::skip || !r.env.cdi_spec) {
    r.step("CDI spec", Outcome::skipped, "--cdi skip");
    return true;
  }
  auto text = r.env.cdi_spec(r.opt.binary.link);
  if (!text) return r.failed("CDI spec", text.error().message);
  auto existing = read_host(r.env.host, r.opt.cdi_output);
  if (!existing) return r.failed("CDI spec", existing.error().message);
  if (existing->has_value() && **existing == *text) {
    r.step("CDI spec", Outcome::unchanged, r.opt.cdi_output);
    return true;
  }
  if (auto st = write_host(r.env.host, r.opt.cdi_output, *text); !st)
    return r.failed("CDI spec", st.error().message);
  // A spec that was there before install is the user's (or the GPU Operator's): not ours to
  // remove on uninstall.
  if (!existing->has_value() || state.cdi_spec_path) state.cdi_spec_path = r.opt.cdi_output;
  r.step("CDI spec", Outcome::changed, r.opt.cdi_output);
  return true;
}

// What install wrote to containerd's config: the file, and for version 3 the drop-in too.
struct ConfigEdit {
  struct File {
    std::string path;
    bool existed = false;
    std::string old_text, new_text, backup;
  };
  std::vector<File> files;  // in the order setup wrote them
  bool changed() const { return !files.empty(); }
};

// Step: the runtime handler in containerd's config, through `setup containerd`'s planner, on
// host paths read and written under the host root as `gpufence setup --host-root` does.
bool edit_containerd_config(Run& r, ConfigEdit& edit) {
  const HostFs& host = r.env.host;
  SetupOptions so;
  so.flavor = r.layout.flavor;
  so.config_path = r.layout.config_path;
  so.runtime_name = r.opt.runtime_name;
  so.binary = r.opt.binary.link;  // the host path containerd will exec
  so.version = r.opt.config_version;
  ReadFile read = [&host](const std::string& path) { return read_host(host, path); };
  // k3s renders runtimes of its own for the binaries it finds (setup avoids their names).
  IsExecutable executable = [&host](const std::string& path) {
    auto info = host.stat(path);
    return info &&
           (info->type == FileType::symlink ||
            (info->type != FileType::directory && ::access(host.resolve(path).c_str(), X_OK) == 0));
  };
  auto plan = plan_containerd_setup(so, read, executable);
  if (!plan) return r.failed("containerd config", plan.error().message);
  // What setup saw already wrong in the file (left alone) is worth a line; its advice to
  // restart is not: install restarts containerd itself.
  for (const auto& note : plan->notes) {
    if (note.starts_with("restart ")) continue;
    r.report.notes.push_back(note);
  }
  // The RuntimeClass names the handler install was asked for: one setup had to rename (k3s
  // renders a runtime of that name itself) would send GPU pods to a runtime that is not ours.
  if (plan->handler_name != r.opt.runtime_name)
    return r.failed("containerd config",
                    cat(r.layout.config_path, ": handler '", r.opt.runtime_name,
                        "' is taken on this node (setup would name it '", plan->handler_name,
                        "'); pick another --runtime-name and the RuntimeClass handler to match"));
  if (plan->changes.empty()) {
    r.step("containerd config", Outcome::unchanged,
           cat(r.layout.config_path, " already has runtime ", r.opt.runtime_name));
    return true;
  }
  auto backups = apply_setup_plan(*plan, host);  // host paths back: <file>.bak-<UTC time>[.N]
  if (!backups)
    return r.failed("containerd config",
                    cat(backups.error().message, "; the previous config is left in place"));
  // One backup per file that existed, in the plan's order (version 3: the drop-in, then the
  // main config's imports).
  size_t next_backup = 0;
  for (const auto& c : plan->changes) {
    ConfigEdit::File f{c.path, c.existed, c.old_text, c.new_text, ""};
    if (c.existed && next_backup < backups->size()) f.backup = (*backups)[next_backup++];
    r.step("containerd config", Outcome::changed,
           cat(c.path, c.existed ? cat(" (backup ", f.backup, ")") : std::string(" (created)")));
    edit.files.push_back(std::move(f));
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

Status restart_containerd(Run& r) {
  auto argv = host_command(r.opt.host_exec, r.layout.restart, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return std::unexpected(res.error());
  if (res->exit_code != 0)
    return fail(Errc::io, "`", shell_words(argv), "` exited ", res->exit_code, ": ",
                trim(res->out));
  r.report.restarted = true;
  return {};
}

bool save_state(Run& r, const InstallState& state);

// After a failed restart or verification: every file this install wrote back as it was (the
// last written first), containerd restarted on them, and the record of the config as it was
// before this run (a first install's withdrawn: uninstall must not "restore" it).
void roll_back(Run& r, const ConfigEdit& edit, InstallState& state, const InstallState& prior) {
  for (auto f = edit.files.rbegin(); f != edit.files.rend(); ++f) {
    Status st = f->existed ? write_host(r.env.host, f->path, f->old_text)
                           : (::unlink(r.env.host.resolve(f->path).c_str()) == 0 || errno == ENOENT
                                  ? Status{}
                                  : fail_errno("unlink", f->path));
    if (!st) {
      r.report.notes.push_back(cat("ROLLBACK FAILED: ", st.error().message, "; restore ", f->path,
                                   f->existed ? " from " + f->backup : std::string(" (remove it)"),
                                   " by hand"));
      return;
    }
    r.report.notes.push_back(f->existed ? cat("restored the previous ", f->path)
                                        : cat("removed ", f->path, " (install created it)"));
    if (!f->backup.empty()) ::unlink(r.env.host.resolve(f->backup).c_str());  // == the file
  }
  if (!prior.config_path.empty()) state.config_path = prior.config_path;
  state.config_changed = prior.config_changed;
  state.config_files = prior.config_files;
  save_state(r, state);
  if (auto rs = restart_containerd(r); !rs) {
    r.report.notes.push_back("restart after rollback failed: " + rs.error().message);
  } else if (auto ready = wait_ready(r); !ready) {
    r.report.notes.push_back("after rollback: " + ready.error().message);
  } else {
    r.report.notes.push_back("containerd is running again on the previous config");
  }
}

Result<InstallState> load_state(const HostFs& host, const std::string& path) {
  auto text = read_host(host, path);
  if (!text) return std::unexpected(text.error());
  if (!text->has_value()) return InstallState{};
  return parse_install_state(**text, path);
}

bool save_state(Run& r, const InstallState& state) {
  std::string text = install_state_to_json(state);
  auto existing = read_host(r.env.host, r.opt.state_file);
  if (existing && existing->has_value() && **existing == text) return true;
  if (auto st = write_host(r.env.host, r.opt.state_file, text); !st)
    return r.failed("state", st.error().message);
  return true;
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

InstallReport run_install(const InstallOptions& opt, const InstallEnv& env) {
  InstallReport report;
  report.command = "install";
  auto started = env.now();
  Run r{opt, env, report, {}, {}};
  auto finish = [&] {
    report.elapsed = std::chrono::duration_cast<milliseconds>(env.now() - started);
    return report;
  };
  auto previous = load_state(env.host, opt.state_file);
  if (!previous) {
    r.failed("state", previous.error().message);
    return finish();
  }
  InstallState state = *previous;

  // Step 1: where this node's containerd keeps its config and socket.
  if (!find_layout(r)) return finish();
  // Step 2: the shim on the host first: the config about to name it must never dangle.
  if (!put_binary(r) || !smoke_test_binary(r)) return finish();
  // Step 3: its config, if the node has none.
  if (!put_runtime_config(r, state)) return finish();
  // Step 4: the CDI spec the shim and containerd read device edits from.
  if (!put_cdi_spec(r, state)) return finish();
  // Step 5: the handler in containerd's config (backup kept by setup).
  ConfigEdit edit;
  if (!edit_containerd_config(r, edit)) return finish();

  state.distribution = report.distribution;
  state.runtime_name = opt.runtime_name;
  state.socket = r.layout.socket;
  state.restart = r.layout.restart;
  state.binary_link = opt.binary.link;
  state.versions_dir = opt.binary.versions_dir;
  const InstallState prior = state;
  // Backups this run made of text an earlier install wrote: not the user's, dropped once verified.
  std::vector<std::string> superseded;
  if (edit.changed()) {
    // A second install that changes the config again keeps the first one's record of each file
    // (was it there, its backup: the user's text) and only the text it now holds, so uninstall
    // still restores the file as it was before any install.
    if (!state.config_changed || state.config_path != r.layout.config_path)
      state.config_files.clear();
    state.config_path = r.layout.config_path;
    state.config_changed = true;
    for (const auto& f : edit.files) {
      auto known =
          std::find_if(state.config_files.begin(), state.config_files.end(),
                       [&](const InstallState::ConfigFile& c) { return c.path == f.path; });
      if (known == state.config_files.end()) {
        state.config_files.push_back({f.path, f.existed, f.backup, f.new_text});
      } else {
        known->written = f.new_text;
        if (!f.backup.empty()) superseded.push_back(f.backup);
      }
    }
  } else if (state.config_path != r.layout.config_path) {
    // Already configured before any install of ours: uninstall leaves it alone.
    state.config_path = r.layout.config_path;
    state.config_changed = false;
    state.config_files.clear();
  }
  if (!save_state(r, state)) return finish();

  // Step 6: restart only when the config changed or the running containerd lacks the handler.
  bool loaded = false;
  if (!edit.changed()) {
    auto now_loaded = probe_once(r, milliseconds(2000));
    loaded = now_loaded && has_handler(*now_loaded, opt.runtime_name, opt.binary.link);
  }
  if (loaded) {
    r.step("restart", Outcome::unchanged, "not needed: containerd already runs the handler");
  } else {
    auto rs = restart_containerd(r);
    if (!rs) {
      r.failed("restart", rs.error().message);
      if (edit.changed()) roll_back(r, edit, state, prior);
      return finish();
    }
    r.step("restart", Outcome::changed,
           shell_words(host_command(opt.host_exec, r.layout.restart, opt.host_pid)));
  }

  // Step 7: the running containerd, not the file, is the proof.
  auto running = wait_ready(r);
  if (!running) {
    r.failed("verify", running.error().message);
    if (edit.changed()) roll_back(r, edit, state, prior);
    return finish();
  }
  if (!has_handler(*running, opt.runtime_name, opt.binary.link)) {
    std::vector<std::string> names;
    for (const auto& l : *running) names.push_back(l.name);
    r.failed("verify", cat("containerd at ", r.layout.socket, " has no runtime ", opt.runtime_name,
                           " with BinaryName ", opt.binary.link, " (it has: ", join(names, ", "),
                           "); is ", r.layout.config_path, " the file it reads?"));
    if (edit.changed()) roll_back(r, edit, state, prior);
    return finish();
  }
  r.step("verify", Outcome::unchanged,
         cat("containerd runs handler ", opt.runtime_name, " -> ", opt.binary.link));
  for (const auto& b : superseded) ::unlink(env.host.resolve(b).c_str());
  return finish();
}

InstallReport run_uninstall(const InstallOptions& opt, const InstallEnv& env) {
  InstallReport report;
  report.command = "uninstall";
  auto started = env.now();
  Run r{opt, env, report, {}, {}};
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

  // Step 1: the config as it was before install, only if nobody edited any of its files since:
  // all of them are checked before the first is touched.
  bool restored = false;
  if (state.config_changed) {
    for (const auto& f : state.config_files) {
      auto current = read_host(env.host, f.path);
      if (!current) {
        r.failed("containerd config", current.error().message);
        return finish();
      }
      if (current->value_or("") != f.written) {
        r.failed("containerd config",
                 cat(f.path, " was edited after install; left alone, as the rest of the config (",
                     f.existed ? "the pre-install file is " + f.backup
                               : std::string("it did not exist before install"),
                     ")"));
        return finish();
      }
      if (f.existed) {
        auto backup = read_host(env.host, f.backup);
        if (!backup || !backup->has_value()) {
          r.failed("containerd config",
                   cat("backup ", f.backup, " is gone; ", f.path, " left as it is"));
          return finish();
        }
      }
    }
    for (auto f = state.config_files.rbegin(); f != state.config_files.rend(); ++f) {
      if (f->existed) {
        auto backup = read_host(env.host, f->backup);
        Status w = backup ? write_host(env.host, f->path, backup->value_or(""))
                          : Status(std::unexpected(backup.error()));
        if (!w) {
          r.failed("containerd config", w.error().message);
          return finish();
        }
        r.step("containerd config", Outcome::changed, cat(f->path, " restored from ", f->backup));
      } else {
        if (::unlink(env.host.resolve(f->path).c_str()) != 0 && errno != ENOENT) {
          r.failed("containerd config", fail_errno("unlink", f->path).error().message);
          return finish();
        }
        r.step("containerd config", Outcome::changed, f->path + " removed (install created it)");
      }
    }
    restored = true;
  } else {
    r.step("containerd config", Outcome::unchanged,
           state.config_path + " had the handler before install: left alone");
  }

  // Step 2: containerd on the restored config, and proof the handler is gone.
  if (restored) {
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
    r.step("verify", Outcome::unchanged, "containerd no longer has handler " + state.runtime_name);
    // The backups' text is the config again: the copies install made are no longer needed.
    for (const auto& f : state.config_files)
      if (f.existed) ::unlink(env.host.resolve(f.backup).c_str());
  }

  // Step 3: the files install created.
  if (state.cdi_spec_path) {
    if (::unlink(env.host.resolve(*state.cdi_spec_path).c_str()) == 0)
      r.step("CDI spec", Outcome::changed, *state.cdi_spec_path + " removed");
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
  ::rmdir(env.host.resolve(fs::path(opt.state_file).parent_path().string()).c_str());
  return finish();
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
