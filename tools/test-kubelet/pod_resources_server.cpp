#include "pod_resources_server.hpp"

#include <filesystem>

#include "podresources/v1/api.grpc.pb.h"

namespace gpufence::test {

class PodResourcesServer::Service final : public v1::PodResourcesLister::Service {
 public:
  Service(std::string resource, std::vector<PodAllocation> allocations,
          std::vector<std::string> allocatable)
      : m_resource(std::move(resource)),
        m_allocations(std::move(allocations)),
        m_allocatable(std::move(allocatable)) {}

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* out) override {
    for (const auto& a : m_allocations) {
      v1::PodResources* pod = nullptr;
      for (auto& p : *out->mutable_pod_resources()) {
        if (p.name() == a.pod && p.namespace_() == a.pod_namespace) pod = &p;
      }
      if (!pod) {
        pod = out->add_pod_resources();
        pod->set_name(a.pod);
        pod->set_namespace_(a.pod_namespace);
      }
      auto* c = pod->add_containers();
      c->set_name(a.container);
      if (!a.device_ids.empty()) {
        auto* d = c->add_devices();
        d->set_resource_name(m_resource);
        for (const auto& id : a.device_ids) d->add_device_ids(id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext*, const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* out) override {
    if (!m_allocatable.empty()) {
      auto* d = out->add_devices();
      d->set_resource_name(m_resource);
      for (const auto& id : m_allocatable) d->add_device_ids(id);
    }
    return grpc::Status::OK;
  }

 private:
  std::string m_resource;
  std::vector<PodAllocation> m_allocations;
  std::vector<std::string> m_allocatable;
};

PodResourcesServer::PodResourcesServer(std::string socket_path, std::string resource_name,
                                       std::vector<PodAllocation> allocations,
                                       std::vector<std::string> allocatable)
    : m_socket(std::move(socket_path)),
      m_service(std::make_unique<Service>(std::move(resource_name), std::move(allocations),
                                          std::move(allocatable))) {}

PodResourcesServer::~PodResourcesServer() {
  stop();
}

bool PodResourcesServer::start() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(m_socket).parent_path(), ec);
  std::filesystem::remove(m_socket, ec);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + m_socket, grpc::InsecureServerCredentials());
  builder.RegisterService(m_service.get());
  m_server = builder.BuildAndStart();
  return m_server != nullptr;
}

void PodResourcesServer::stop() {
  if (!m_server) return;
  m_server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  m_server.reset();
  std::error_code ec;
  std::filesystem::remove(m_socket, ec);
}

}  // namespace gpufence::test
