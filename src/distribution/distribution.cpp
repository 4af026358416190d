#include "distribution/distribution.hpp"

#include <algorithm>
#include <optional>

#include "common/strings.hpp"

namespace gpufence {
namespace {

// Systemd unit directories, packaged and local (k3s's and rke2's install scripts use both).
constexpr std::string_view kUnitDirs[] = {"/etc/systemd/system", "/usr/local/lib/systemd/system",
                                          "/lib/systemd/system", "/usr/lib/systemd/system"};

constexpr std::string_view kSystemctlRestart[] = {"systemctl", "restart"};

// microk8s (snap): `args/containerd` starts containerd with --config
// ${SNAP_DATA}/args/containerd.toml, --state ${SNAP_COMMON}/run/containerd, --address
// ${SNAP_COMMON}/run/containerd.sock; that file is rendered from containerd-template.toml at
// every start (canonical/microk8s microk8s-resources/default-args/containerd,
// run-containerd-with-args); the kubelet's --root-dir is ${SNAP_COMMON}/var/lib/kubelet.
constexpr std::string_view kMicrok8sMarkers[] = {"/var/snap/microk8s/current/args"};
constexpr std::string_view kMicrok8sRestart[] = {"snap", "restart", "microk8s.daemon-containerd"};
// rke2 runs k3s's agent code: the same files under its own directory, the same containerd
// state and socket (/run/k3s/containerd), the default kubelet root.
constexpr std::string_view kRke2Markers[] = {"/var/lib/rancher/rke2/agent/etc/containerd"};
constexpr std::string_view kRke2Units[] = {"rke2-server", "rke2-agent"};
// k3s: pkg/agent/config sets containerd's State to /run/k3s/containerd and its Address to
// <State>/containerd.sock; config.toml is rendered at every start (from config.toml.tmpl when
// present); the kubelet uses /var/lib/kubelet since v0.10 (k3s-io/k3s#840).
constexpr std::string_view kK3sMarkers[] = {"/var/lib/rancher/k3s/agent/etc/containerd"};
constexpr std::string_view kK3sUnits[] = {"k3s", "k3s-agent"};
// k0s: containerd --config=/etc/k0s/containerd.toml --state=/run/k0s/containerd
// --address=/run/k0s/containerd.sock (k0s pkg/component/worker/containerd/component.go, Start).
// containerd.toml is k0s's own while its first line is "# k0s_managed=true" (isK0sManagedConfig):
// it rewrites it at every start and loads /etc/k0s/containerd.d/*.toml (since 1.27.1). k0s with
// containerd 1.x writes version 2 and merges a drop-in holding plugins."io.containerd.grpc.v1.cri"
// into /run/k0s/containerd-cri.toml, which containerd.toml imports (configurer.go,
// handleImports); k0s 1.36+ (containerd 2.2) writes version 3 with
// imports = ["/etc/k0s/containerd.d/*.toml"] and refuses a drop-in of another version
// (k0sproject/k0s#7689). It watches containerd.d and restarts its containerd on a change
// (watchDropinConfigs). So gpufence writes one drop-in of its own, gpufence.toml, and never
// containerd.toml. --kubelet-root-dir defaults to <data-dir>/kubelet, /var/lib/k0s/kubelet (k0s
// docs/directories.md). `k0s install` names the units k0scontroller and k0sworker.
constexpr std::string_view kK0sMarkers[] = {"/etc/k0s/containerd.toml", "/etc/k0s/containerd.d"};
constexpr std::string_view kK0sUnits[] = {"k0scontroller", "k0sworker"};
// containerd under systemd (kubeadm and most clusters): containerd's own defaults
// (defaults.DefaultConfigDir, DefaultStateDir, DefaultAddress) and the kubelet's
// (--root-dir /var/lib/kubelet).
constexpr std::string_view kContainerdMarkers[] = {"/etc/containerd",
                                                   "/run/containerd/containerd.sock"};
constexpr std::string_view kContainerdUnits[] = {"containerd"};

constexpr DistributionRow kTable[] = {
    {Distribution::microk8s,
     "microk8s",
     ConfigSource::template_file,
     "/var/snap/microk8s/current/args",
     "/var/snap/microk8s/current/args/containerd-template.toml",
     "/var/snap/microk8s/current/args/containerd.toml",
     "/var/snap/microk8s/common/run/containerd.sock",
     "/var/snap/microk8s/common/run/containerd",
     "/var/snap/microk8s/common/var/lib/kubelet",
     kMicrok8sMarkers,
     {},
     kMicrok8sRestart},
    {Distribution::rke2,
     "rke2",
     ConfigSource::go_template,
     "/var/lib/rancher/rke2/agent/etc/containerd",
     "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl",
     "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
     "/run/k3s/containerd/containerd.sock",
     "/run/k3s/containerd",
     "/var/lib/kubelet",
     kRke2Markers,
     kRke2Units,
     {}},
    {Distribution::k3s,
     "k3s",
     ConfigSource::go_template,
     "/var/lib/rancher/k3s/agent/etc/containerd",
     "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl",
     "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
     "/run/k3s/containerd/containerd.sock",
     "/run/k3s/containerd",
     "/var/lib/kubelet",
     kK3sMarkers,
     kK3sUnits,
     {}},
    {Distribution::k0s,
     "k0s",
     ConfigSource::drop_in_dir,
     "/etc/k0s/containerd.d",
     "/etc/k0s/containerd.d/gpufence.toml",
     "/etc/k0s/containerd.toml",
     "/run/k0s/containerd.sock",
     "/run/k0s/containerd",
     "/var/lib/k0s/kubelet",
     kK0sMarkers,
     kK0sUnits,
     {}},
    {Distribution::containerd,
     "containerd",
     ConfigSource::file,
     "/etc/containerd",
     "/etc/containerd/config.toml",
     "/etc/containerd/config.toml",
     "/run/containerd/containerd.sock",
     "/run/containerd",
     "/var/lib/kubelet",
     kContainerdMarkers,
     kContainerdUnits,
     {}},
};

bool has_unit(const HostFs& host, std::string_view unit) {
  return std::any_of(std::begin(kUnitDirs), std::end(kUnitDirs), [&](std::string_view dir) {
    return host.exists(cat(dir, "/", unit, ".service"));
  });
}

}  // namespace

std::span<const DistributionRow> distribution_table() {
  return kTable;
}

const DistributionRow& distribution_row(Distribution d) {
  for (const auto& row : kTable)
    if (row.id == d) return row;
  return kTable[std::size(kTable) - 1];  // unreachable: every enumerator has a row (tested)
}

Result<Distribution> parse_distribution(std::string_view name) {
  for (const auto& row : kTable)
    if (row.name == name) return row.id;
  return fail(Errc::invalid_argument, "unknown distribution '", name, "' (", distribution_names(),
              ")");
}

std::string_view distribution_name(Distribution d) {
  return distribution_row(d).name;
}

std::string distribution_names() {
  std::string out;
  for (const auto& row : kTable) out += cat(out.empty() ? "" : ", ", row.name);
  return out;
}

std::string device_plugin_dir() { return "/var/lib/kubelet/device-plugins"; }

std::string pod_resources_socket(const DistributionRow& row) {
  return cat(row.kubelet_root, "/pod-resources/kubelet.sock");
}

std::string task_dir(const DistributionRow& row) {
  return cat(row.state_dir, "/io.containerd.runtime.v2.task");
}

std::vector<std::string> every_distribution(NodePath what) {
  std::vector<std::string> out;
  for (const auto& row : kTable) {
    std::string path;
    switch (what) {
      case NodePath::containerd_config:
        path = row.config_read;
        break;
      case NodePath::device_plugin_dir:
        path = device_plugin_dir();
        break;
      case NodePath::pod_resources_socket:
        path = pod_resources_socket(row);
        break;
      case NodePath::task_dir:
        path = task_dir(row);
        break;
    }
    if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(std::move(path));
  }
  return out;
}

Result<Distribution> detect_distribution(const HostFs& host, std::vector<std::string>& notes) {
  std::optional<Distribution> found;
  std::string looked;
  for (const auto& row : kTable) {
    for (std::string_view marker : row.markers) {
      looked += cat(looked.empty() ? "" : ", ", marker);
      if (!host.exists(marker)) continue;
      if (!found) {
        found = row.id;
        notes.push_back(cat("detected ", row.name, " (", marker, " exists)"));
      } else if (*found != row.id) {
        notes.push_back(
            cat("also found ", marker, " (", row.name, "); not used: --distribution to choose it"));
      }
    }
  }
  if (found) return *found;
  return fail(Errc::not_found, "no containerd found under host root ", host.root().string(),
              " (looked for ", looked, "); pass --distribution");
}

std::vector<std::string> restart_command(const DistributionRow& row, const HostFs& host) {
  if (row.restart_units.empty())
    return std::vector<std::string>(row.restart_command.begin(), row.restart_command.end());
  std::string_view unit = row.restart_units.front();
  for (std::string_view u : row.restart_units) {
    if (has_unit(host, u)) {
      unit = u;
      break;
    }
  }
  std::vector<std::string> argv(std::begin(kSystemctlRestart), std::end(kSystemctlRestart));
  argv.emplace_back(unit);
  return argv;
}

}  // namespace gpufence
