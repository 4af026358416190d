// Where each Kubernetes distribution keeps containerd's config, socket and state and the
// kubelet's directory, and how its containerd is restarted: the one table that install, `setup
// containerd`, the doctor, the device plugin's defaults and the Helm chart's test all read.
// Every path is a host path (read under --host-root). The facts and their upstream sources are in
// docs/install.md, "Distributions".
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

enum class Distribution { containerd, microk8s, k3s, rke2, k0s };

// How a distribution gets containerd's config, and so where gpufence's handler goes.
enum class ConfigSource {
  file,  // containerd reads the file itself: versions 1-2 edited in place, 3-4 a conf.d drop-in
  template_file,  // microk8s: a template it renders into the file at every start (${SNAP}...)
  go_template,    // k3s, rke2: config.toml.tmpl (config-v3.toml.tmpl on containerd 2.x), rendered
                  // into config.toml at every start
  drop_in_dir,    // k0s: gpufence's own *.toml in the directory k0s loads beside the config it
                  // generates (config_input is that file; config_read, k0s's, is never written)
};

struct DistributionRow {
  Distribution id;
  std::string_view name;
  ConfigSource config_source;
  std::string_view config_dir;    // the directory of containerd's config files
  std::string_view config_input;  // what gpufence edits: the file, the template, its drop-in
  std::string_view config_read;   // the file containerd is started with (what the doctor judges)
  std::string_view socket;        // containerd's CRI socket (--address)
  std::string_view state_dir;     // containerd's --state: task bundles live under it
  std::string_view kubelet_root;  // the kubelet's --root-dir
  std::span<const std::string_view> markers;  // detection: the distribution when one exists
  // Restart: `systemctl restart` of the first of these units installed (the first when none
  // is), or `restart_command` when there are none.
  std::span<const std::string_view> restart_units;
  std::span<const std::string_view> restart_command;
};

// Every row, in detection order: a Kubernetes distribution before the plain containerd that
// may sit beside it (Docker installs one that no kubelet uses).
std::span<const DistributionRow> distribution_table();
const DistributionRow& distribution_row(Distribution d);

Result<Distribution> parse_distribution(std::string_view name);
std::string_view distribution_name(Distribution d);
std::string distribution_names();  // "microk8s, rke2, k3s, k0s, containerd", for messages

// Paths that follow from a row.
// The kubelet's device-plugin directory is one constant on every distribution, whatever its
// --root-dir: kubelet.sock lives in /var/lib/kubelet/device-plugins (k8s.io/kubelet
// pkg/apis/deviceplugin/v1beta1 DevicePluginPath, used by the device manager's NewManagerImpl;
// kubernetes/kubernetes#68567). Only the pod-resources socket follows --root-dir.
std::string device_plugin_dir();
std::string pod_resources_socket(
    const DistributionRow& row);                   // <kubelet>/pod-resources/kubelet.sock
std::string task_dir(const DistributionRow& row);  // <state>/io.containerd.runtime.v2.task

// One path of every distribution, in detection order, each once: the doctor's defaults, which
// look wherever any distribution keeps the thing.
enum class NodePath { containerd_config, device_plugin_dir, pod_resources_socket, task_dir };
std::vector<std::string> every_distribution(NodePath what);

// Looks for each distribution's markers under the host root, in detection order. Each other
// distribution found is a note.
Result<Distribution> detect_distribution(const HostFs& host, std::vector<std::string>& notes);

// The argv that restarts the distribution's containerd on this host (k3s, rke2, k0s: the server
// or the agent unit, whichever is installed).
std::vector<std::string> restart_command(const DistributionRow& row, const HostFs& host);

}  // namespace gpufence
