// Writing a setup plan: backups first, gpufence's own files, and the RuntimeClass manifest
// (containerd/setup_parts.hpp).
#include "containerd/setup.hpp"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include "common/file.hpp"
#include "common/go_match.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "containerd/setup_parts.hpp"
#include "containerd/toml_text.hpp"
#include "containerd/versions.hpp"

namespace gpufence {

using namespace setup_parts;

std::vector<std::string> choose_backup_paths(const SetupPlan& plan, const HostFs& host) {
  const std::string stamp = utc_compact_stamp(std::chrono::system_clock::now());
  std::vector<std::string> out;
  for (const auto& change : plan.changes) {
    if (!change.existed) {
      out.emplace_back();
      continue;
    }
    std::string base = cat(change.path, ".bak-", stamp);
    for (int n = 0;; ++n) {
      std::string name = n == 0 ? base : cat(base, ".", n);
      bool taken = host.exists(name) || std::find(out.begin(), out.end(), name) != out.end();
      if (!taken) {
        out.push_back(name);
        break;
      }
    }
  }
  return out;
}

Status apply_setup_plan_with(const SetupPlan& plan, const HostFs& host,
                             const std::vector<std::string>& backups) {
  if (backups.size() != plan.changes.size())
    return fail(Errc::internal, "apply_setup_plan: one backup path per change");
  // Every file is checked before the first is written (a version 3 plan writes two): a conflict
  // found half-way would leave a drop-in without its import, or the reverse.
  std::vector<std::filesystem::path> targets;
  for (const auto& change : plan.changes) {
    Result<std::filesystem::path> target = host.resolve(change.path);
    if (change.links == LinkPolicy::refuse) {
      if (auto st = check_own_file_path(host, change.path); !st) return std::unexpected(st.error());
    } else {
      target = write_target_through_links(host.resolve(change.path), host.root());
    }
    if (!target) return std::unexpected(target.error());
    auto current = read_file(*target);
    if (current ? (!change.existed || *current != change.old_text)
                : (change.existed || current.error().code != Errc::not_found)) {
      return fail(Errc::conflict, change.path,
                  " changed since it was read (or could not be read again): nothing written; run "
                  "gpufence setup containerd again");
    }
    targets.push_back(*target);
  }
  for (size_t i = 0; i < plan.changes.size(); ++i) {
    const auto& change = plan.changes[i];
    const std::filesystem::path local = host.resolve(change.path);
    const auto* target = &targets[i];
    std::error_code ec;
    if (change.links == LinkPolicy::follow)
      std::filesystem::create_directories(target->parent_path(), ec);
    if (!backups[i].empty()) {
      // write_backup_exclusive names the file "<file>.bak-<stamp>[.N]": the stamp is the chosen
      // name's suffix, and a different name back means the chosen one was taken meanwhile.
      const std::string prefix = change.path + ".bak-";
      if (!backups[i].starts_with(prefix))
        return fail(Errc::internal, backups[i], ": not a backup name of ", change.path);
      std::string stamp = backups[i].substr(prefix.size());
      auto backup = write_backup_exclusive(local, change.old_text, stamp);
      if (!backup) return std::unexpected(backup.error().wrap("backup"));
      if (*backup != host.resolve(backups[i])) {
        ::unlink(backup->c_str());
        return fail(Errc::conflict, "backup ", backups[i],
                    " was taken after it was chosen: nothing more written");
      }
    }
    Status written = change.links == LinkPolicy::refuse
                         ? write_own_file(host, change.path, change.new_text)
                         : write_file_atomic(*target, change.new_text);
    if (!written) return std::unexpected(written.error());
  }
  return {};
}

Status check_own_file_path(const HostFs& host, const std::string& path) {
  std::filesystem::path prefix = "/";
  const std::filesystem::path full(path);
  for (auto it = full.begin(); it != full.end(); ++it) {
    if (*it == "/" || it->empty()) continue;
    prefix /= *it;
    auto info = host.stat(prefix.string());
    if (!info) {
      if (info.error().code == Errc::not_found) return {};  // made by the write, as a directory
      return std::unexpected(info.error());
    }
    const bool last = std::next(it) == full.end();
    if (info->type == FileType::symlink)
      return fail(Errc::denied, path, ": ", prefix.string(),
                  " is a symbolic link, and gpufence writes its own file only where no link "
                  "decides where the bytes land: nothing written (remove the link)");
    if (last && info->type != FileType::regular)
      return fail(Errc::denied, path, " is not a regular file: nothing written");
    if (!last && info->type != FileType::directory)
      return fail(Errc::denied, path, ": ", prefix.string(), " is not a directory");
  }
  return {};
}

Status write_own_file(const HostFs& host, const std::string& path, std::string_view text) {
  if (auto st = check_own_file_path(host, path); !st) return st;
  // Symlinks::none: openat2 RESOLVE_NO_SYMLINKS on the whole path, so a link planted at a
  // directory since the check fails the write; one at the name is replaced by the rename.
  return write_file_atomic(host.resolve(path), text, Durability::fsync, Symlinks::none,
                           MakeDir::yes);
}

Result<std::vector<std::string>> apply_setup_plan(const SetupPlan& plan, const HostFs& host) {
  auto backups = choose_backup_paths(plan, host);
  if (auto st = apply_setup_plan_with(plan, host, backups); !st) return std::unexpected(st.error());
  std::vector<std::string> out;
  for (const auto& b : backups)
    if (!b.empty()) out.push_back(b);
  return out;
}

Status check_k0s_runtime_name(const HostFs& host, const std::string& drop_in,
                              const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(drop_in).parent_path();
  if (auto names = host.list(dir.string()); !names && names.error().code != Errc::not_found)
    return std::unexpected(names.error());  // unreadable: what k0s loads is unknown
  // The files k0s loads: filepath.Glob("<dir>/*.toml"), dot-files such as ".toml" included.
  for (const auto& p : go_glob(host, (dir / "*.toml").string())) {
    if (p == drop_in) continue;
    auto text = host.read(p);
    if (!text) return std::unexpected(text.error().wrap("k0s drop-in"));
    auto cfg = parse_containerd_config(*text, p);
    if (!cfg) return std::unexpected(cfg.error());
    // Under any version's CRI table: containerd 2.x migrates a file of another version (or of
    // none) before it merges it, and k0s merges what it finds.
    if (defines_runtime_in_any_version(*cfg, name)) {
      return fail(Errc::conflict, p, " defines runtime '", name,
                  "' too: k0s and containerd merge the drop-ins in ", dir.string(),
                  " into one table, so the handler would not be gpufence's alone (its BinaryName, "
                  "runtime_path or annotations could win): nothing written. Choose another "
                  "--runtime-name (and the RuntimeClass's handler to match), or remove that file");
    }
  }
  return {};
}

std::string runtime_class_manifest(const std::string& handler) {
  return cat("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: ", handler,
             "\nhandler: ", handler, "\n");
}

}  // namespace gpufence
