#include "cri_client.hpp"

namespace gpufence::test {

namespace {

void add_pod_labels(const CriPod& pod, google::protobuf::Map<std::string, std::string>& labels) {
  // The labels the kubelet puts on every sandbox and container (pkg/kubelet/types/labels.go).
  labels["io.kubernetes.pod.name"] = pod.name;
  labels["io.kubernetes.pod.namespace"] = pod.namespace_;
  labels["io.kubernetes.pod.uid"] = pod.uid;
}

void set_host_network(runtime::v1::NamespaceOption* ns) {
  ns->set_network(runtime::v1::NODE);
  ns->set_pid(runtime::v1::CONTAINER);
  ns->set_ipc(runtime::v1::POD);
}

}  // namespace

runtime::v1::PodSandboxConfig sandbox_config(const CriPod& pod) {
  runtime::v1::PodSandboxConfig c;
  auto* md = c.mutable_metadata();
  md->set_name(pod.name);
  md->set_namespace_(pod.namespace_);
  md->set_uid(pod.uid);
  md->set_attempt(0);
  add_pod_labels(pod, *c.mutable_labels());
  for (const auto& [k, v] : pod.annotations) (*c.mutable_annotations())[k] = v;
  auto* linux = c.mutable_linux();
  if (!pod.cgroup_parent.empty()) linux->set_cgroup_parent(pod.cgroup_parent);
  auto* sc = linux->mutable_security_context();
  set_host_network(sc->mutable_namespace_options());
  // The kubelet marks the sandbox privileged when any of its containers is.
  sc->set_privileged(pod.privileged);
  return c;
}

runtime::v1::ContainerConfig container_config(const CriPod& pod,
                                              const v1beta1::ContainerAllocateResponse& alloc) {
  runtime::v1::ContainerConfig c;
  c.mutable_metadata()->set_name(pod.container);
  c.mutable_metadata()->set_attempt(pod.attempt);
  c.mutable_image()->set_image(pod.image);
  for (const auto& arg : pod.command) c.add_command(arg);
  add_pod_labels(pod, *c.mutable_labels());
  (*c.mutable_labels())["io.kubernetes.container.name"] = pod.container;

  // envs: the device manager's Envs (a map, so one value a key) first, then the pod spec's:
  // kubelet_pods.go GenerateRunContainerOptions starts from the container manager's
  // GetResources (the device plugins' envs) and appends makeEnvironmentVariables' list. containerd
  // keeps both entries (oci.WithEnv, replaceOrAppendEnvValues appends each override) and the
  // process sees the last: the pod's own value wins (docs/containerd-lines.md, "Env order").
  std::map<std::string, std::string> envs(alloc.envs().begin(), alloc.envs().end());
  for (const auto& [k, v] : envs) {
    auto* kv = c.add_envs();
    kv->set_key(k);
    kv->set_value(v);
  }
  for (const auto& [k, v] : pod.env) {
    auto* kv = c.add_envs();
    kv->set_key(k);
    kv->set_value(v);
  }
  // mounts: the device manager's Mounts first, then the pod's volume mounts (the same
  // GenerateRunContainerOptions appends makeMounts' list to GetResources' mounts);
  // kuberuntime_container.go makeMounts then carries each in that order: host path, container
  // path, read-only, private propagation.
  for (const auto& m : alloc.mounts()) {
    auto* cm = c.add_mounts();
    cm->set_container_path(m.container_path());
    cm->set_host_path(m.host_path());
    cm->set_readonly(m.read_only());
    cm->set_propagation(runtime::v1::PROPAGATION_PRIVATE);
  }
  for (const auto& v : pod.volumes) {
    auto* cm = c.add_mounts();
    cm->set_container_path(v.container_path);
    cm->set_host_path(v.host_path);
    cm->set_readonly(v.read_only);
    cm->set_propagation(v.host_to_container ? runtime::v1::PROPAGATION_HOST_TO_CONTAINER
                                            : runtime::v1::PROPAGATION_PRIVATE);
  }
  // devices: kuberuntime makeDevices: PathOnHost, PathInContainer, Permissions.
  for (const auto& d : alloc.devices()) {
    auto* cd = c.add_devices();
    cd->set_container_path(d.container_path());
    cd->set_host_path(d.host_path());
    cd->set_permissions(d.permissions());
  }
  // annotations: the device manager's Annotations become container annotations.
  for (const auto& [k, v] : alloc.annotations()) (*c.mutable_annotations())[k] = v;
  (*c.mutable_annotations())["io.kubernetes.container.name"] = pod.container;
  // CDI devices: the CRI field (KEP-4009), set from the Allocate answer's cdi_devices.
  for (const auto& d : alloc.cdi_devices()) c.add_cdi_devices()->set_name(d.name());

  auto* sc = c.mutable_linux()->mutable_security_context();
  sc->set_privileged(pod.privileged);
  set_host_network(sc->mutable_namespace_options());
  return c;
}

CriClient::CriClient(const std::string& socket_path, std::chrono::seconds deadline)
    : m_deadline(deadline),
      m_stub(runtime::v1::RuntimeService::NewStub(
          grpc::CreateChannel("unix://" + socket_path, grpc::InsecureChannelCredentials()))) {}

void CriClient::set_deadline(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() + m_deadline);
}

grpc::Status CriClient::version(runtime::v1::VersionResponse* out) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::VersionRequest req;
  req.set_version("v1");
  return m_stub->Version(&ctx, req, out);
}

grpc::Status CriClient::run_pod_sandbox(const runtime::v1::PodSandboxConfig& config,
                                        const std::string& handler, std::string* sandbox_id) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::RunPodSandboxRequest req;
  *req.mutable_config() = config;
  req.set_runtime_handler(handler);
  runtime::v1::RunPodSandboxResponse resp;
  auto st = m_stub->RunPodSandbox(&ctx, req, &resp);
  if (st.ok()) *sandbox_id = resp.pod_sandbox_id();
  return st;
}

grpc::Status CriClient::create_container(const std::string& sandbox_id,
                                         const runtime::v1::ContainerConfig& config,
                                         const runtime::v1::PodSandboxConfig& sandbox,
                                         std::string* container_id) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::CreateContainerRequest req;
  req.set_pod_sandbox_id(sandbox_id);
  *req.mutable_config() = config;
  *req.mutable_sandbox_config() = sandbox;
  runtime::v1::CreateContainerResponse resp;
  auto st = m_stub->CreateContainer(&ctx, req, &resp);
  if (st.ok()) *container_id = resp.container_id();
  return st;
}

grpc::Status CriClient::start_container(const std::string& container_id) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::StartContainerRequest req;
  req.set_container_id(container_id);
  runtime::v1::StartContainerResponse resp;
  return m_stub->StartContainer(&ctx, req, &resp);
}

grpc::Status CriClient::container_status(const std::string& container_id,
                                         runtime::v1::ContainerStatus* out) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::ContainerStatusRequest req;
  req.set_container_id(container_id);
  runtime::v1::ContainerStatusResponse resp;
  auto st = m_stub->ContainerStatus(&ctx, req, &resp);
  if (st.ok()) *out = resp.status();
  return st;
}

grpc::Status CriClient::exec_sync(const std::string& container_id,
                                  const std::vector<std::string>& cmd, std::chrono::seconds timeout,
                                  runtime::v1::ExecSyncResponse* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout + m_deadline);
  runtime::v1::ExecSyncRequest req;
  req.set_container_id(container_id);
  for (const auto& a : cmd) req.add_cmd(a);
  req.set_timeout(timeout.count());
  return m_stub->ExecSync(&ctx, req, out);
}

grpc::Status CriClient::stop_container(const std::string& container_id,
                                       std::chrono::seconds grace) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::StopContainerRequest req;
  req.set_container_id(container_id);
  req.set_timeout(grace.count());
  runtime::v1::StopContainerResponse resp;
  return m_stub->StopContainer(&ctx, req, &resp);
}

grpc::Status CriClient::remove_container(const std::string& container_id) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::RemoveContainerRequest req;
  req.set_container_id(container_id);
  runtime::v1::RemoveContainerResponse resp;
  return m_stub->RemoveContainer(&ctx, req, &resp);
}

grpc::Status CriClient::stop_pod_sandbox(const std::string& sandbox_id) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::StopPodSandboxRequest req;
  req.set_pod_sandbox_id(sandbox_id);
  runtime::v1::StopPodSandboxResponse resp;
  return m_stub->StopPodSandbox(&ctx, req, &resp);
}

grpc::Status CriClient::remove_pod_sandbox(const std::string& sandbox_id) {
  grpc::ClientContext ctx;
  set_deadline(ctx);
  runtime::v1::RemovePodSandboxRequest req;
  req.set_pod_sandbox_id(sandbox_id);
  runtime::v1::RemovePodSandboxResponse resp;
  return m_stub->RemovePodSandbox(&ctx, req, &resp);
}

}  // namespace gpufence::test
