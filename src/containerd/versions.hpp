// What each containerd config version means to gpufence, one row per version: where the CRI
// tables live, what CDI and NRI default to, how setup adds its handler, and which containerd
// release line first writes it (`containerd config default`). The facts with their sources:
// docs/containerd-lines.md ("What differed between the lines") and docs/install.md ("Config
// versions: every containerd line").
#pragma once

#include <optional>
#include <span>
#include <string_view>

namespace gpufence {

// How `setup containerd` adds to a root config of this version.
enum class HandlerPlacement {
  // containerd 1.x (which reads versions 1-2) replaces a whole plugin section from an import,
  // so a drop-in would drop the user's other CRI settings: the root file is edited in place.
  in_place,
  // containerd 2.x merges imports deeply: a conf.d drop-in listed in `imports`.
  drop_in,
};

struct ConfigVersionRow {
  int version;
  std::string_view cri_plugin;  // the table of plugins that holds `containerd.runtimes`
  bool cdi_by_default;          // enable_cdi when the file does not say
  bool nri_by_default;          // NRI on when the file does not say (and the release is unknown)
  HandlerPlacement placement;
  // The template k3s and rke2 render a config of this version from, in their containerd config
  // directory ("" where they render none).
  std::string_view k3s_template;
  // The first release line whose `containerd config default` writes this version (major,
  // minor); nullopt for a version no release writes any more.
  std::optional<std::pair<int, int>> written_from;
};

// Versions 1 to kMaxConfigVersion, in order.
std::span<const ConfigVersionRow> config_version_table();
// The row of `version`, clamped into 1..kMaxConfigVersion.
const ConfigVersionRow& config_version_row(int version);

}  // namespace gpufence
