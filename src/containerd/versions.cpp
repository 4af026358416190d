#include "containerd/versions.hpp"

#include <algorithm>

#include "containerd/config.hpp"

namespace gpufence {
namespace {

constexpr ConfigVersionRow kVersions[] = {
    // Version 1 (no version line on 1.x): the CRI plugin under its short name "cri"
    // (v1MigratePluginName keeps it for migration); no CDI, no NRI.
    {1, "cri", false, false, HandlerPlacement::in_place, "", std::nullopt},
    // Version 2: containerd 1.x's `config default` (1.6.20, 1.7.24 measured). enable_cdi off by
    // default (1.7; 1.6 has none); NRI off by default on 1.7. k3s on containerd 1.x reads
    // config.toml.tmpl (k3s pkg/agent/containerd/config_linux.go, setupContainerdConfig).
    {2, "io.containerd.grpc.v1.cri", false, false, HandlerPlacement::in_place, "config.toml.tmpl",
     std::pair{1, 0}},
    // Version 3: containerd 2.0-2.2. The CRI runtime moved to io.containerd.cri.v1.runtime; CDI
    // and NRI are on by default (2.1.9 measured). k3s on containerd 2.x renders its version 3 base
    // template and reads config-v3.toml.tmpl first (setupContainerdConfig).
    {3, "io.containerd.cri.v1.runtime", true, true, HandlerPlacement::drop_in,
     "config-v3.toml.tmpl", std::pair{2, 0}},
    // Version 4: containerd 2.3 (v2.3.4's `config default` starts `version = 4`). It moved only
    // the server's own settings (grpc, ttrpc, debug, metrics) into plugins (serviceMigrate,
    // cmd/containerd/server/config/config.go); the CRI tables keep their version 3 names. No
    // k3s template of this version is known: k3s renders version 3 on every 2.x line.
    {4, "io.containerd.cri.v1.runtime", true, true, HandlerPlacement::drop_in, "", std::pair{2, 3}},
};

static_assert(std::size(kVersions) == kMaxConfigVersion, "one row per config version");

}  // namespace

std::span<const ConfigVersionRow> config_version_table() {
  return kVersions;
}

const ConfigVersionRow& config_version_row(int version) {
  const int last = static_cast<int>(std::size(kVersions));
  return kVersions[std::clamp(version, 1, last) - 1];
}

}  // namespace gpufence
