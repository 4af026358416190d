#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "gpu/wire_contract.hpp"
#include "podresources/podresources.hpp"
#include "podresources/v1/api.grpc.pb.h"

namespace gpufence {

std::vector<std::string> gpu_ids_of_cdi_names(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& n : names) {
    auto cdi = split_cdi_name(n);
    if (!cdi || !is_gpu_cdi_kind(cdi->kind) || cdi->name.empty()) continue;
    std::string id(cdi->name);
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(std::move(id));
  }
  return out;
}

std::vector<std::string> other_cdi_names(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& n : names) {
    auto cdi = split_cdi_name(n);
    if (!cdi || is_gpu_cdi_kind(cdi->kind) || cdi->kind.empty() || cdi->name.empty()) continue;
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

namespace {

Result<std::vector<KubeletAllocation>> list_with(v1::PodResourcesLister::Stub& stub,
                                                 const std::string& socket_path,
                                                 const std::string& resource_name,
                                                 std::chrono::milliseconds deadline) {
  std::vector<KubeletAllocation> out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  v1::ListPodResourcesResponse resp;
  auto st = stub.List(&ctx, v1::ListPodResourcesRequest(), &resp);
  if (!st.ok())
    return fail(Errc::rpc, "PodResources List on ", socket_path, ": ", st.error_message());
  for (const auto& pod : resp.pod_resources()) {
    for (const auto& c : pod.containers()) {
      KubeletAllocation a{pod.namespace_(), pod.name(), c.name(), {}, {}};
      for (const auto& d : c.devices()) {
        if (d.resource_name() == resource_name)
          a.device_ids.insert(a.device_ids.end(), d.device_ids().begin(), d.device_ids().end());
      }
      // GPUs through DRA (gpufence-dra, or any driver naming GPU CDI kinds).
      std::vector<std::string> cdi;
      for (const auto& dr : c.dynamic_resources())
        for (const auto& cr : dr.claim_resources())
          for (const auto& n : cr.cdi_devices()) cdi.push_back(n.name());
      for (auto& id : gpu_ids_of_cdi_names(cdi))
        if (std::find(a.device_ids.begin(), a.device_ids.end(), id) == a.device_ids.end())
          a.device_ids.push_back(std::move(id));
      a.other_cdi_names = other_cdi_names(cdi);
      out.push_back(std::move(a));
    }
  }
  return out;
}

}  // namespace

Result<std::vector<KubeletAllocation>> list_pod_resources(const std::string& socket_path,
                                                          const std::string& resource_name,
                                                          std::chrono::milliseconds deadline) {
  auto channel = grpc::CreateChannel("unix://" + socket_path, grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(channel);
  return list_with(*stub, socket_path, resource_name, deadline);
}

Result<PodResourcesView> read_pod_resources(const std::string& socket_path,
                                            const std::string& resource_name,
                                            std::chrono::milliseconds deadline) {
  auto channel = grpc::CreateChannel("unix://" + socket_path, grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(channel);
  PodResourcesView view;
  auto listed = list_with(*stub, socket_path, resource_name, deadline);
  if (!listed) return std::unexpected(listed.error());
  view.allocations = std::move(*listed);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
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
