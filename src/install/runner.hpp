// The outside world install talks to, behind seams so tests inject it: the commands it runs on
// the host (restart containerd) and the CRI question "which runtimes has the running containerd
// loaded?".
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/process.hpp"

namespace gpufence {

class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  virtual Result<ProcessResult> run(const std::vector<std::string>& argv) = 0;
};

// run_process: the real thing.
class SystemProcessRunner final : public ProcessRunner {
 public:
  Result<ProcessResult> run(const std::vector<std::string>& argv) override;
};

// How a host command is run when gpufence itself is not in the host's namespaces.
//   direct   run as is (gpufence runs on the host: --host-root /)
//   nsenter  `nsenter -t 1 -m -u -i -n -p -- CMD`: in PID 1's mount, UTS, IPC, network and PID
//            namespaces, so `systemctl` and `snap` are the host's and talk to the host's systemd.
//            Needs hostPID and privileged. chroot is not enough: systemctl refuses to act in a
//            chroot ("Running in chroot, ignoring request") — docs/install.md.
enum class HostExec { direct, nsenter };

// `pid`: whose namespaces nsenter joins (1, the host's init, in a DaemonSet with hostPID).
std::vector<std::string> host_command(HostExec how, const std::vector<std::string>& argv,
                                      int pid = 1);

struct LoadedRuntime {
  std::string name;
  std::string runtime_type;
  std::optional<std::string> binary_name;    // options.BinaryName
  std::string runtime_path;                  // runtimePath: a shim run instead of runc's
  std::vector<std::string> pod_annotations;  // PodAnnotations: copied from the pod into specs
};

class RuntimeProbe {
 public:
  virtual ~RuntimeProbe() = default;
  // The runtime handlers the containerd answering at `socket` (a path this process can open)
  // has loaded. Fails when it does not answer within `timeout`.
  virtual Result<std::vector<LoadedRuntime>> loaded_runtimes(const std::string& socket,
                                                             std::chrono::milliseconds timeout) = 0;
  // The release of the containerd answering at `socket` (CRI Version's runtime_version, e.g.
  // "v2.3.4"): which config version it writes, and which template k3s renders for it.
  virtual Result<std::string> runtime_version(const std::string& socket,
                                              std::chrono::milliseconds timeout) {
    (void)timeout;
    return fail(Errc::unsupported, "no CRI Version from ", socket);
  }
  // Whether containerd's NRI socket at `path` (a path this process can open) accepts a
  // connection: containerd listens there only with NRI enabled (ctrd@v2.3.4:internal/nri/nri.go
  // `Start`). containerd's CRI Status does not show NRI's config, so this is install's proof.
  virtual bool nri_listening(const std::string& path);
};

// Asks CRI RuntimeService.Status (verbose) over gRPC: containerd's answer carries its live CRI
// config as JSON under info["config"]. runtime.v1 first, then v1alpha2 (containerd 1.6 serves
// both; 2.x only v1).
std::unique_ptr<RuntimeProbe> make_cri_probe();

// The runtimes in containerd's CRI config JSON (info["config"]): containerd.runtimes.<name>
// with runtimeType and options.BinaryName. Pure, so it is tested on literal answers.
Result<std::vector<LoadedRuntime>> parse_cri_config_runtimes(std::string_view config_json);

}  // namespace gpufence
