// What `gpufence install` changed on a node, kept in /etc/gpufence/install-state.json, so that
// `uninstall` removes exactly that: the containerd config restored from setup's backup (only if
// nobody edited it since), the files install created (only if they still hold what it wrote).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct InstallState {
  std::string distribution;
  std::string runtime_name;
  std::string socket;
  std::vector<std::string> restart;
  // The containerd config (host path) and what install did to it: the file itself, and for a
  // version 3 config also the drop-in setup added to its imports.
  std::string config_path;
  bool config_changed = false;  // false: it already had the handler; uninstall leaves it
  struct ConfigFile {
    std::string path;      // host path
    bool existed = false;  // false: install created it; uninstall removes it
    std::string backup;    // host path of setup's backup (when it existed)
    std::string written;   // the text install wrote: uninstall restores only over this
  };
  std::vector<ConfigFile> config_files;  // in the order setup wrote them
  // Files install created; removed only while they still hold what was written.
  std::optional<std::string> runtime_config_path, runtime_config_written;
  std::optional<std::string> cdi_spec_path;
  std::string binary_link, versions_dir;
};

std::string install_state_to_json(const InstallState& s);
Result<InstallState> parse_install_state(std::string_view text, std::string_view origin);

}  // namespace gpufence
