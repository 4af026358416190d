// `gpufence install` / `gpufence uninstall`: put gpufence onto a node, by hand as root or from a
// privileged DaemonSet with the host's root at /host. Everything is planned first (a refusal
// changes nothing), then the journal (state.hpp) names every file the run will touch before the
// first one changes, and each step is recorded after it is done. A failure undoes this run; a
// kill leaves the journal, from which the next install finishes and uninstall takes all back.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "common/paths.hpp"
#include "containerd/config.hpp"
#include "install/binary.hpp"
#include "install/enforcement.hpp"
#include "install/layout.hpp"
#include "install/runner.hpp"

namespace gpufence {

enum class CdiMode { generate, skip };

struct InstallOptions {
  std::optional<Distribution> distribution;  // detected when empty
  std::string config_path;                   // host path; the distribution's when empty
  std::string socket;                        // host path; the distribution's when empty
  std::vector<std::string> restart_command;  // the distribution's when empty
  HostExec host_exec = HostExec::direct;
  int host_pid = 1;  // nsenter's target: a process in the host's namespaces
  std::string runtime_name = std::string(kDefaultHandlerName);
  std::optional<int> config_version;  // for a new config (setup's --config-version)
  BinaryInstallOptions binary;
  std::string runtime_config = std::string(paths::kRuntimeConfig);
  // The driver's NVML as a host path, written as [devices] nvml_library into the runtime.toml
  // install creates ("": the runtimes' own search, for a driver installed on the host). A driver
  // elsewhere (the GPU Operator's /run/nvidia/driver) is not on the host's library path, so
  // without it gpufence-nri and gpufence-runtime refuse every GPU container.
  std::string nvml_library;
  // The namespace gpufence's node agents run in, written as [nri] node_agent_namespaces into the
  // runtime.toml install creates ("": none), so gpufence-nri leaves the device plugin its GPUs.
  std::string node_agent_namespace;
  // CDI kinds of another allocator whose devices are GPUs (NVIDIA's DRA driver:
  // "k8s.gpu.nvidia.com/claim"), written as [cdi] gpu_kinds into the runtime.toml install creates.
  std::vector<std::string> gpu_cdi_kinds;
  std::string state_file = std::string(paths::kInstallState);
  CdiMode cdi = CdiMode::generate;
  std::string cdi_output = "/etc/cdi/nvidia.yaml";
  // Where the allocation is enforced (install/enforcement.hpp); automatic: nri where the running
  // containerd has NRI >= v0.10, else runtime.
  EnforcementRequest enforcement = EnforcementRequest::automatic;
  std::string nri_plugin_name = std::string(paths::kNriPluginName);  // required_plugins entry
  // containerd >= 2.2: the same binary linked again as <plugin_path>/NN-name, which containerd
  // launches with NRI_PLUGIN_NAME=gpufence-fence: the validator that rejects every container the
  // decider did not decide. Required too, so containers fail while either is down.
  std::string nri_fence_name = "gpufence-fence";
  std::string nri_fence_index = "20";
  // default_validator's tolerate_missing_plugins_annotation; "" (the default) writes none. NRI
  // reads the key from the POD's annotations (KEY, KEY/pod, KEY/container.NAME), so any pod
  // annotated with it "true" is created undecided while the plugins are down: a waiver every pod
  // holds unless an admission policy forbids it (docs/nri.md). A key an earlier install wrote is
  // taken out again.
  std::string nri_tolerate_annotation;
  std::string nri_socket = "/var/run/nri/nri.sock";  // host path: the socket proving NRI is on
  // nri and both: gpufence-nri copied as the shim is (link /usr/local/bin/gpufence-nri), and
  // linked into containerd's NRI plugin_path as NN-name, the form containerd's NRI requires of a
  // plugin it launches (nri@v0.12.0 pkg/adaptation/adaptation.go, startPlugins/parsePluginName).
  BinaryInstallOptions nri_binary{"", std::string(paths::kNriBinary),
                                  std::string(paths::kVersionsDir)};
  std::string nri_plugin_path = "/opt/nri/plugins";  // host path: plugin_path's default
  std::string nri_plugin_index = "10";
  // How long containerd may take to answer CRI after a restart.
  std::chrono::milliseconds ready_timeout{60'000};
  // How long a run waits for another install or uninstall to finish (install/lock.hpp).
  std::chrono::milliseconds lock_timeout{60'000};
};

// The CDI spec text for this node's GPUs; `hook_path` is gpufence-runtime's host path.
using CdiSpecSource = std::function<Result<std::string>(const std::string& hook_path)>;

// Everything outside the process, injected (tests pass fakes).
struct InstallEnv {
  const HostFs& host;
  ProcessRunner& runner;
  RuntimeProbe& probe;
  CdiSpecSource cdi_spec;
  std::function<void(std::chrono::milliseconds)> sleep;
  std::function<std::chrono::steady_clock::time_point()> now;
  // Called after each journal write with the step just recorded (tests kill the process there).
  std::function<void(std::string_view step)> checkpoint = {};
  // A line to show while the run goes on (that it waits for another run's lock), before the
  // report; nothing when empty.
  std::function<void(std::string_view line)> progress = {};
};

enum class Outcome { changed, unchanged, skipped, failed };
std::string_view outcome_name(Outcome o);

struct InstallStep {
  std::string name;
  Outcome outcome = Outcome::unchanged;
  std::string detail;
};

struct InstallReport {
  std::string command;  // "install" or "uninstall"
  std::string distribution, config_path, socket;
  std::vector<InstallStep> steps;
  std::vector<std::string> notes;
  std::optional<std::string> failure;  // set: exit non-zero, this is why
  bool restarted = false;
  std::optional<Enforcement> enforcement;  // the mode this run chose
  std::string nri_socket;
  std::chrono::milliseconds elapsed{0};
  bool ok() const { return !failure; }
  bool changed_anything() const;
};

InstallReport run_install(const InstallOptions& opt, const InstallEnv& env);
InstallReport run_uninstall(const InstallOptions& opt, const InstallEnv& env);

// True when containerd at the layout's socket answers and has loaded `runtime_name` with
// BinaryName `binary` (for `install --watch`'s re-checks).
Result<bool> handler_loaded(const InstallEnv& env, const std::string& socket,
                            const std::string& runtime_name, const std::string& binary,
                            std::chrono::milliseconds timeout);

// True when containerd listens on its NRI socket (`install --watch`'s re-check in nri mode).
bool nri_enabled(const InstallEnv& env, const std::string& nri_socket);

// One screen: a line per step, the failure, the notes.
std::string render_install_report(const InstallReport& report);

}  // namespace gpufence
