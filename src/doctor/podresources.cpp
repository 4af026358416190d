#include <grpcpp/grpcpp.h>

#include "doctor/gather.hpp"
#include "podresources/v1/api.grpc.pb.h"

namespace gpufence {

Result<PodResourcesView> read_pod_resources(const std::string& socket_path,
                                            const std::string& resource_name) {
  auto channel = grpc::CreateChannel("unix://" + socket_path, grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(channel);
  PodResourcesView view;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::ListPodResourcesResponse resp;
    auto st = stub->List(&ctx, v1::ListPodResourcesRequest(), &resp);
    if (!st.ok())
      return fail(Errc::rpc, "PodResources List on ", socket_path, ": ", st.error_message());
    for (const auto& pod : resp.pod_resources()) {
      for (const auto& c : pod.containers()) {
        KubeletAllocation a{pod.namespace_(), pod.name(), c.name(), {}};
        for (const auto& d : c.devices()) {
          if (d.resource_name() == resource_name)
            a.device_ids.insert(a.device_ids.end(), d.device_ids().begin(), d.device_ids().end());
        }
        view.allocations.push_back(std::move(a));
      }
    }
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::AllocatableResourcesResponse resp;
    auto st = stub->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &resp);
    if (!st.ok())
      return fail(Errc::rpc, "PodResources GetAllocatableResources on ", socket_path, ": ",
                  st.error_message());
    for (const auto& d : resp.devices()) {
      if (d.resource_name() == resource_name)
        view.allocatable.insert(view.allocatable.end(), d.device_ids().begin(),
                                d.device_ids().end());
    }
  }
  return view;
}

}  // namespace gpufence
