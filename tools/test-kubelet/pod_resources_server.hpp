// A test PodResources server (the kubelet's PodResourcesLister v1), serving a fixed view:
// which container holds which devices, and which devices are allocatable. Stands in for the
// kubelet, which cannot be installed here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

namespace gpufence::test {

struct PodAllocation {
  std::string pod_namespace, pod, container;
  std::vector<std::string> device_ids;
};

class PodResourcesServer {
 public:
  PodResourcesServer(std::string socket_path, std::string resource_name,
                     std::vector<PodAllocation> allocations, std::vector<std::string> allocatable);
  ~PodResourcesServer();
  bool start();
  void stop();

 private:
  class Service;
  std::string m_socket;
  std::unique_ptr<Service> m_service;
  std::unique_ptr<grpc::Server> m_server;
};

}  // namespace gpufence::test
