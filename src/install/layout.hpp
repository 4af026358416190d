// The distribution's paths and restart command as install uses them, from the one table
// (distribution/distribution.hpp; sources in docs/install.md). Every path is a host path.
#pragma once

#include <string>
#include <vector>

#include "common/hostfs.hpp"
#include "distribution/distribution.hpp"

namespace gpufence {

struct NodeLayout {
  Distribution distribution = Distribution::containerd;
  std::string config_path;           // the file gpufence edits (a template for microk8s, k3s)
  std::string socket;                // containerd's CRI socket
  std::vector<std::string> restart;  // the host command that restarts containerd
  std::string kubelet_dir;
  std::vector<std::string> notes;  // what detection saw besides the choice
};

// The paths and restart command of a distribution on this host (k3s/rke2: server or agent unit,
// whichever is installed).
NodeLayout layout_for(Distribution d, const HostFs& host);

}  // namespace gpufence
