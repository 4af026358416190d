// uninstall: everything the record says install did, taken back (install/flow.hpp).
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

}  // namespace gpufence::install_flow
