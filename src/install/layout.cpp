#include "install/layout.hpp"

namespace gpufence {
namespace {

// Systemd unit directories, packaged and local (k3s's and rke2's install scripts use both).
constexpr std::string_view kUnitDirs[] = {"/etc/systemd/system", "/usr/local/lib/systemd/system",
                                          "/lib/systemd/system", "/usr/lib/systemd/system"};

bool has_unit(const HostFs& host, std::string_view unit) {
  for (auto dir : kUnitDirs) {
    if (host.exists(cat(dir, "/", unit))) return true;
  }
  return false;
}

// The server unit when installed, else the agent unit when installed, else the server unit.
std::string rancher_unit(const HostFs& host, const std::string& server, const std::string& agent) {
  if (has_unit(host, server + ".service")) return server;
  if (has_unit(host, agent + ".service")) return agent;
  return server;
}

}  // namespace

Result<Distribution> parse_distribution(std::string_view name) {
  if (name == "containerd") return Distribution::containerd;
  if (name == "microk8s") return Distribution::microk8s;
  if (name == "k3s") return Distribution::k3s;
  if (name == "rke2") return Distribution::rke2;
  return fail(Errc::invalid_argument, "unknown distribution '", name,
              "' (auto, containerd, microk8s, k3s, rke2)");
}

std::string_view distribution_name(Distribution d) {
  switch (d) {
    case Distribution::containerd:
      return "containerd";
    case Distribution::microk8s:
      return "microk8s";
    case Distribution::k3s:
      return "k3s";
    case Distribution::rke2:
      return "rke2";
  }
  return "containerd";
}

Result<Distribution> detect_distribution(const HostFs& host, std::vector<std::string>& notes) {
  struct Marker {
    Distribution d;
    std::string_view path;
  };
  // In order of preference: the first found is the one the kubelet uses.
  const Marker markers[] = {
      {Distribution::microk8s, "/var/snap/microk8s/current/args"},
      {Distribution::rke2, "/var/lib/rancher/rke2/agent/etc/containerd"},
      {Distribution::k3s, "/var/lib/rancher/k3s/agent/etc/containerd"},
      {Distribution::containerd, "/etc/containerd"},
      {Distribution::containerd, "/run/containerd/containerd.sock"},
  };
  std::optional<Distribution> found;
  for (const auto& m : markers) {
    if (!host.exists(m.path)) continue;
    if (!found) {
      found = m.d;
      notes.push_back(cat("detected ", distribution_name(m.d), " (", m.path, " exists)"));
    } else if (*found != m.d) {
      notes.push_back(cat("also found ", m.path, " (", distribution_name(m.d),
                          "); not used: --distribution to choose it"));
    }
  }
  if (found) return *found;
  std::string looked;
  for (const auto& m : markers) looked += cat(looked.empty() ? "" : ", ", m.path);
  return fail(Errc::not_found, "no containerd found under host root ", host.root().string(),
              " (looked for ", looked, "); pass --distribution");
}

NodeLayout layout_for(Distribution d, const HostFs& host) {
  NodeLayout l;
  l.distribution = d;
  switch (d) {
    case Distribution::containerd:
      l.flavor = Flavor::containerd;
      l.config_path = default_config_path(Flavor::containerd);
      l.socket = "/run/containerd/containerd.sock";
      l.restart = {"systemctl", "restart", "containerd"};
      l.kubelet_dir = "/var/lib/kubelet";
      break;
    case Distribution::microk8s:
      l.flavor = Flavor::microk8s;
      l.config_path = default_config_path(Flavor::microk8s);
      l.socket = "/var/snap/microk8s/common/run/containerd.sock";
      l.restart = {"snap", "restart", "microk8s.daemon-containerd"};
      l.kubelet_dir = "/var/snap/microk8s/common/var/lib/kubelet";
      break;
    case Distribution::k3s:
      l.flavor = Flavor::k3s;
      l.config_path = default_config_path(Flavor::k3s);
      l.socket = "/run/k3s/containerd/containerd.sock";
      l.restart = {"systemctl", "restart", rancher_unit(host, "k3s", "k3s-agent")};
      l.kubelet_dir = "/var/lib/kubelet";
      break;
    case Distribution::rke2:
      l.flavor = Flavor::rke2;  // the same Go template mechanism, under rke2's directory
      l.config_path = "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl";
      l.socket = "/run/k3s/containerd/containerd.sock";
      l.restart = {"systemctl", "restart", rancher_unit(host, "rke2-server", "rke2-agent")};
      l.kubelet_dir = "/var/lib/kubelet";
      break;
  }
  return l;
}

}  // namespace gpufence
