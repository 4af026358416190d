// What `gpufence install` changes on a node, kept in /etc/gpufence/install-state.json. It is a
// journal first: written before the first host byte changes, naming every file and directory the
// run will create or change and where each original is, then rewritten after every step. So an
// install killed at any point leaves a record from which `uninstall` takes the node back to the
// user's bytes and `install` finishes (docs/install.md, "Journal").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct InstallState {
  // "installing": the journal of a run in progress, or of one killed or failed part way;
  // "installed": the running containerd was seen to serve the handler.
  std::string phase = "installed";
  std::vector<std::string> steps;  // the steps the last run completed, in order
  std::string distribution;
  std::string runtime_name;
  std::string socket;
  std::vector<std::string> restart;
  // install --enforcement: "runtime" (the handler; also a record from before NRI), "nri", "both".
  std::string enforcement = "runtime";
  std::string nri_socket;  // host path, nri and both
  // A file install creates or changes: the containerd config and its drop-in, the CDI spec.
  struct ManagedFile {
    std::string path;      // host path
    bool existed = false;  // false: install created it; undone by removing it
    std::string backup;    // host path of the user's bytes (when it existed)
    // Every text an install wrote or is about to write there: the file is install's while it
    // holds one of them, the user's when it holds the backup's bytes (or is absent, for a file
    // install created), and edited since install otherwise.
    std::vector<std::string> written;
  };
  // The containerd config (host path) and what install did to it.
  std::string config_path;
  bool config_changed = false;            // false: it already had the handler; uninstall leaves it
  std::vector<ManagedFile> config_files;  // in the order they are written
  // Files install created; removed only while they still hold what was written.
  std::optional<std::string> runtime_config_path, runtime_config_written;
  std::optional<ManagedFile> cdi_spec;  // written empty: a record from before texts were kept
  std::string binary_link, versions_dir;
  // nri and both: gpufence-nri's stable link (its versions in versions_dir) and the link in
  // containerd's NRI plugin_path that makes containerd launch it (<plugin_path>/NN-name); on
  // containerd >= 2.2 also the fence's link there, to the same stable link ("" without one).
  std::string nri_binary_link, nri_plugin_link, nri_fence_link;
  // Directories install creates (parents first): removed on undo when empty again.
  std::vector<std::string> created_dirs;
};

std::string install_state_to_json(const InstallState& s);
Result<InstallState> parse_install_state(std::string_view text, std::string_view origin);

}  // namespace gpufence
