// What the record and a recorded file hold now, and the host reads and writes install's steps
// go through (install/flow.hpp).
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

}  // namespace gpufence::install_flow
