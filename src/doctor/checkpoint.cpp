// The kubelet's device checkpoint, apart from parse.cpp: it decodes the device plugin API's
// protobuf, which the fuzz build of the doctor's parsers does not link.
#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "common/base64.hpp"
#include "common/strings.hpp"
#include "deviceplugin/v1beta1/api.pb.h"  // proto/: the kubelet's message, not the plugin
#include "doctor/parse.hpp"

namespace gpufence {

Result<std::vector<CheckpointAllocation>> parse_kubelet_checkpoint(std::string_view text,
                                                                   std::string_view resource) {
  auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("Data") || !doc["Data"].is_object())
    return fail(Errc::parse, "not a kubelet device checkpoint (no Data object)");
  const auto& data = doc["Data"];
  auto entries = data.find("PodDeviceEntries");
  if (entries == data.end() || entries->is_null()) return std::vector<CheckpointAllocation>{};
  if (!entries->is_array()) return fail(Errc::parse, "PodDeviceEntries is not a list");
  std::vector<CheckpointAllocation> out;
  for (const auto& e : *entries) {
    if (!e.is_object() || e.value("ResourceName", "") != resource) continue;
    CheckpointAllocation a;
    a.pod_uid = e.value("PodUID", "");
    a.container = e.value("ContainerName", "");
    if (auto ids = e.find("DeviceIDs"); ids != e.end() && ids->is_object()) {
      for (const auto& [numa, list] : ids->items()) {
        if (!list.is_array()) continue;
        for (const auto& id : list)
          if (id.is_string()) a.device_ids.push_back(id.get<std::string>());
      }
    }
    auto resp = e.find("AllocResp");
    if (resp == e.end() || !resp->is_string())
      return fail(Errc::parse, "entry ", a.pod_uid, "/", a.container, ": no AllocResp");
    auto bytes = base64_decode(resp->get<std::string>());
    v1beta1::ContainerAllocateResponse answer;
    if (!bytes || !answer.ParseFromString(*bytes))
      return fail(Errc::parse, "entry ", a.pod_uid, "/", a.container,
                  ": AllocResp is not a ContainerAllocateResponse");
    // containerd stats the host path at create: its number is the minor the container gets.
    for (const auto& d : answer.devices()) {
      std::string_view name = d.host_path();
      auto slash = name.rfind('/');
      if (slash != std::string_view::npos) name.remove_prefix(slash + 1);
      if (!name.starts_with("nvidia")) continue;
      name.remove_prefix(6);
      if (name.empty() ||
          !std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); }))
        continue;  // nvidiactl, nvidia-uvm, ...
      if (auto minor = parse_number<unsigned>(name)) a.device_minors.push_back(*minor);
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace gpufence
