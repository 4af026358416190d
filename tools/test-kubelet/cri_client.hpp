// The test kubelet's CRI v1 client: what the kubelet's kuberuntime does to run a pod through a
// container runtime (containerd's CRI plugin here), reduced to the calls a GPU pod needs, and the
// kubelet's translation of a device plugin's Allocate answer into the CRI ContainerConfig
// (pkg/kubelet/cm/devicemanager + pkg/kubelet/kuberuntime; docs/containerd-lines.md).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "cri/v1/api.grpc.pb.h"
#include "deviceplugin/api.hpp"

namespace gpufence::test {

// One pod with one container, as a Pod object would describe it.
struct CriPod {
  std::string name;
  std::string namespace_ = "default";
  std::string uid;
  std::string container = "app";
  std::string image;
  std::vector<std::string> command;
  std::vector<std::pair<std::string, std::string>> env;  // the pod spec's own env (hostile input)
  struct Volume {                                        // a hostPath volume and its volumeMount
    std::string host_path, container_path;
    bool read_only = true;
    bool host_to_container = false;  // mountPropagation: HostToContainer (else None: private)
  };
  std::vector<Volume> volumes;
  bool privileged = false;
  std::string cgroup_parent;  // cgroupfs style; empty: the runtime's default
  // metadata.annotations of the Pod object (hostile input): the kubelet passes them all on the
  // sandbox (kuberuntime_sandbox.go generatePodSandboxConfig, newPodAnnotations), never on a
  // container; containerd copies those the handler's pod_annotations match into each container's
  // spec itself (internal/cri/server container_create*.go, getPassthroughAnnotations).
  std::map<std::string, std::string> annotations;
  int attempt = 0;  // the container's restart count (ContainerMetadata.attempt)
};

// RunPodSandbox's config for a host-network pod: network, PID and IPC per the kubelet's choices
// for hostNetwork: true (network NODE, pid CONTAINER, ipc POD), no hostname (the runtime uses the
// node's), the kubelet's pod labels.
runtime::v1::PodSandboxConfig sandbox_config(const CriPod& pod);

// CreateContainer's config: the pod spec's env and hostPath volumes, then the device plugin's
// Allocate answer carried as the kubelet does:
// envs -> envs, mounts -> mounts (host path, container path, read-only), devices -> devices (host
// path, container path, cgroup permissions), annotations -> container annotations, cdi_devices ->
// CDI_devices.
runtime::v1::ContainerConfig container_config(const CriPod& pod,
                                              const v1beta1::ContainerAllocateResponse& alloc);

class CriClient {
 public:
  explicit CriClient(const std::string& socket_path,
                     std::chrono::seconds deadline = std::chrono::seconds(60));

  grpc::Status version(runtime::v1::VersionResponse* out);
  grpc::Status run_pod_sandbox(const runtime::v1::PodSandboxConfig& config,
                               const std::string& handler, std::string* sandbox_id);
  grpc::Status create_container(const std::string& sandbox_id,
                                const runtime::v1::ContainerConfig& config,
                                const runtime::v1::PodSandboxConfig& sandbox,
                                std::string* container_id);
  grpc::Status start_container(const std::string& container_id);
  grpc::Status container_status(const std::string& container_id, runtime::v1::ContainerStatus* out);
  grpc::Status exec_sync(const std::string& container_id, const std::vector<std::string>& cmd,
                         std::chrono::seconds timeout, runtime::v1::ExecSyncResponse* out);
  grpc::Status stop_container(const std::string& container_id, std::chrono::seconds grace);
  grpc::Status remove_container(const std::string& container_id);
  grpc::Status stop_pod_sandbox(const std::string& sandbox_id);
  grpc::Status remove_pod_sandbox(const std::string& sandbox_id);

 private:
  void set_deadline(grpc::ClientContext& ctx) const;
  std::chrono::seconds m_deadline;
  std::unique_ptr<runtime::v1::RuntimeService::Stub> m_stub;
};

}  // namespace gpufence::test
