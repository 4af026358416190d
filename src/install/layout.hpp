// Which Kubernetes distribution runs this node, and where its containerd keeps its config, its
// socket and how it is restarted. Every path is a host path (read under --host-root).
//
// Facts (docs/install.md has the sources):
// - plain containerd: /etc/containerd/config.toml, /run/containerd/containerd.sock, systemd unit
//   containerd.service; kubelet at /var/lib/kubelet.
// - microk8s (snap): containerd renders /var/snap/microk8s/current/args/containerd-template.toml
//   at every start; socket /var/snap/microk8s/common/run/containerd.sock; restarted with
//   `snap restart microk8s.daemon-containerd`; kubelet at
//   /var/snap/microk8s/common/var/lib/kubelet.
// - k3s: renders /var/lib/rancher/k3s/agent/etc/containerd/config.toml from config.toml.tmpl
//   beside it when k3s starts; socket /run/k3s/containerd/containerd.sock; its unit is k3s
//   (server) or k3s-agent (agent).
// - rke2: the same under /var/lib/rancher/rke2, same socket, units rke2-server / rke2-agent.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "containerd/setup.hpp"

namespace gpufence {

enum class Distribution { containerd, microk8s, k3s, rke2 };

Result<Distribution> parse_distribution(std::string_view name);
std::string_view distribution_name(Distribution d);

struct NodeLayout {
  Distribution distribution = Distribution::containerd;
  Flavor flavor = Flavor::containerd;  // how `setup containerd` edits the config
  std::string config_path;             // the file gpufence edits (a template for microk8s, k3s)
  std::string socket;                  // containerd's CRI socket
  std::vector<std::string> restart;    // the host command that restarts containerd
  std::string kubelet_dir;
  std::vector<std::string> notes;  // what detection saw besides the choice
};

// Looks for each distribution's marker files under the host root. A Kubernetes distribution
// wins over a plain containerd beside it (Docker installs one that no kubelet uses).
Result<Distribution> detect_distribution(const HostFs& host, std::vector<std::string>& notes);

// The paths and restart command of a distribution on this host (k3s/rke2: server or agent unit,
// whichever is installed).
NodeLayout layout_for(Distribution d, const HostFs& host);

}  // namespace gpufence
