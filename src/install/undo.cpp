// The undo of a failed install run (install/flow.hpp).
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

}  // namespace gpufence::install_flow
