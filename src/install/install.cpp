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

#include "install/flow.hpp"

namespace gpufence {

using namespace install_flow;

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
