// Running one admitted pod through a CRI runtime as the kubelet does, for gpufence-test-cri and
// its cluster mode: RunPodSandbox with the RuntimeClass handler, CreateContainer with the Allocate
// answer translated (cri_client.hpp), StartContainer, wait for RUNNING; ExecSync; Stop/Remove;
// and PodResources served from what the stand-in allocated. Not a kubelet.
#pragma once

#include <chrono>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "cri_client.hpp"
#include "pod_resources_server.hpp"
#include "test_kubelet.hpp"

namespace gpufence::test {

// Until the device plugin has registered with `kubelet` and advertised a device (bounded); the
// reason on stderr, prefixed with `program`, when it does not.
bool wait_for_plugin(TestKubelet& kubelet, std::chrono::seconds timeout,
                     const std::string& program);

// CRI Version, written as "runtime <name> <version> <api version>"; the reason on stderr when the
// runtime does not answer.
bool print_runtime(CriClient& cri, const std::string& endpoint, const std::string& program,
                   std::ostream& out);

struct PodRun {
  CriPod pod;
  std::vector<std::string> ids;  // the GPUs the stand-in allocated it
  std::string sandbox_id;
  std::string container_id;
  std::string init_container_id;  // its init container's, when it has one
  std::string error;              // "<step>: <message>" once a step failed
  double running_s = 0;
};

// RunPodSandbox of run.pod with the RuntimeClass handler. False with run.error set when it fails.
bool run_sandbox(CriClient& cri, const std::string& handler, std::chrono::seconds timeout,
                 PodRun& run);

// What start_container waits for: a running app container, or an init container that ran to
// completion (exit code 0, as the kubelet requires before it starts the next container).
enum class Until { running, exited };

// CreateContainer of `container` (run.pod, or an init container of it) in run's sandbox with the
// Allocate answer, StartContainer, then until the CRI reports `until` (bounded by `timeout`); its
// CRI id in *id. False with run.error set at the first step that fails.
bool start_container(CriClient& cri, const CriPod& container,
                     const v1beta1::ContainerAllocateResponse& alloc, std::chrono::seconds timeout,
                     Until until, PodRun& run, std::string* id);

// RunPodSandbox, then start_container of run.pod until RUNNING (each step and the wait bounded by
// `timeout`). False with run.error set at the first step that fails.
bool start_pod(CriClient& cri, const std::string& handler,
               const v1beta1::ContainerAllocateResponse& alloc, std::chrono::seconds timeout,
               PodRun& run);

// ExecSync `cmd` in the pod's container; each output line is written as "pod <i> exec <line>".
// A failed call or a non-zero exit sets run.error.
void exec_in_pod(CriClient& cri, int i, const std::vector<std::string>& cmd,
                 std::chrono::seconds timeout, std::ostream& out, PodRun& run);
// The same, each line written as "pod <label> exec <line>" (the cluster mode names pods).
void exec_in_pod(CriClient& cri, const std::string& label, const std::vector<std::string>& cmd,
                 std::chrono::seconds timeout, std::ostream& out, PodRun& run);

// Stop and remove the container and the sandbox, as the kubelet does when a pod is deleted.
void teardown_pod(CriClient& cri, const PodRun& run);

// PodResources from what the stand-in allocated, served on `socket`, then read back through the
// API as a client sees it: "podresources <ns>/<pod>/<container> <resource> <ids>" lines and
// "podresources allocatable <n> allocated <m>". Null (reason on stderr) when it cannot serve.
std::unique_ptr<PodResourcesServer> serve_pod_resources(const std::string& socket,
                                                        const std::vector<PodRun>& runs,
                                                        const TestKubelet::Devices& devices,
                                                        std::ostream& out);

}  // namespace gpufence::test
