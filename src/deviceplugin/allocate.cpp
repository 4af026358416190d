#include "deviceplugin/allocate.hpp"

#include <algorithm>

#include "common/strings.hpp"
#include "gpu/selector.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

std::string plugin_device_id(const Gpu& gpu, DeviceIdStrategy strategy) {
  return strategy == DeviceIdStrategy::uuid ? gpu.uuid : std::to_string(gpu.index);
}

Result<std::vector<Gpu>> validate_allocation(
    const std::vector<std::string>& ids, const std::vector<PluginDevice>& devices,
    const std::function<bool(const std::string&)>& healthy) {
  if (ids.empty()) return fail(Errc::invalid_argument, "no device ids in the request");
  std::vector<Gpu> out;
  for (const auto& id : ids) {
    auto it = std::find_if(devices.begin(), devices.end(),
                           [&](const PluginDevice& d) { return d.id == id; });
    if (it == devices.end()) return fail(Errc::not_found, "unknown device '", id, "'");
    if (!healthy(it->gpu.uuid)) return fail(Errc::denied, "device '", id, "' is Unhealthy");
    if (std::any_of(out.begin(), out.end(), [&](const Gpu& g) { return g.uuid == it->gpu.uuid; })) {
      return fail(Errc::invalid_argument, "device '", id, "' is requested twice");
    }
    out.push_back(it->gpu);
  }
  return out;
}

std::string host_device_path(const std::string& dev_root, const std::string& path) {
  if (dev_root.empty() || dev_root == "/") return path;
  std::string root = dev_root;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root + path;
}

v1beta1::ContainerAllocateResponse build_allocate_response(
    const std::vector<Gpu>& gpus, const PluginOptions& options,
    const std::vector<HostNode>& control_nodes) {
  v1beta1::ContainerAllocateResponse resp;
  std::vector<std::string> uuids;
  for (const auto& g : gpus) uuids.push_back(g.uuid);
  const std::string uuid_list = join(uuids, ",");
  auto& envs = *resp.mutable_envs();

  if (options.list_strategies.contains(ListStrategy::device_specs)) {
    // Even plain runc then isolates by cgroup: only these nodes are created and allowed.
    for (const auto& g : gpus) {
      auto* spec = resp.add_devices();
      spec->set_container_path(g.device_path());
      spec->set_host_path(host_device_path(options.dev_root, g.device_path()));
      spec->set_permissions("rw");
    }
    for (const auto& node : control_nodes) {
      auto* spec = resp.add_devices();
      spec->set_container_path(node.container_path);
      spec->set_host_path(host_device_path(options.dev_root, node.host_path));
      spec->set_permissions("rw");
    }
  }
  if (options.list_strategies.contains(ListStrategy::volume_mounts)) {
    // The form NVIDIA's toolkit reads with accept-nvidia-visible-devices-as-volume-mounts.
    for (const auto& u : uuids) {
      auto* m = resp.add_mounts();
      m->set_container_path(std::string(kMountMarkerRoot) + "/" + u);
      m->set_host_path("/dev/null");
      m->set_read_only(true);
    }
    envs["NVIDIA_VISIBLE_DEVICES"] = std::string(kMountMarkerRoot);
  }
  if (options.list_strategies.contains(ListStrategy::cdi_annotations)) {
    std::vector<std::string> names;
    for (const auto& u : uuids) names.push_back(gpu_cdi_name(u));
    // One key per allocation; GPUs are exclusive, so the first UUID makes it unique on the node.
    (*resp.mutable_annotations())[allocation_annotation_key(options.cdi_annotation_prefix,
                                                            uuids.front())] = join(names, ",");
  }
  if (options.list_strategies.contains(ListStrategy::cdi_cri)) {
    for (const auto& u : uuids) resp.add_cdi_devices()->set_name(gpu_cdi_name(u));
  }
  if (options.list_strategies.contains(ListStrategy::envvar))
    envs["NVIDIA_VISIBLE_DEVICES"] = uuid_list;
  // CUDA then uses the allocated GPU even in a container that can see more.
  if (options.set_cuda_visible_devices) envs["CUDA_VISIBLE_DEVICES"] = uuid_list;
  return resp;
}

std::vector<HostNode> present_control_nodes(const HostFs& host) {
  // NVIDIA's plugin sends these only when they exist (docs/deviceplugin.md).
  std::vector<HostNode> out;
  for (const auto& node : kControlNodes) {
    std::string path(node.path);
    auto info = host.stat(path);
    if (info && info->type == FileType::char_device) out.push_back({path, path});
  }
  return out;
}

}  // namespace gpufence
