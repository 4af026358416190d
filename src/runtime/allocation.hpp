// Where a container's GPU allocation comes from. Only from what the kubelet itself put into the
// container, never from the pod spec (its env, image env, annotations, volumes or capabilities).
// docs/trust-model.md has the reasoning; in short:
//   1. CDI annotations (cdi.k8s.io/<x> = gpufence.io/gpu=<id>,...): the device plugin's Allocate
//      annotations reach the spec only through containerd's container_annotations allow-list
//      (pod annotations do not, unless pod_annotations lets them: check-containerd reports that);
//      gpufence-nri adds the CRI CDIDevices (DRA claims) here. Names of a kind [cdi] gpu_kinds
//      lists count as the GPU nodes their CDI spec gives, by device number;
//   2. the kubelet's device specs: /dev/nvidiaN entries in linux.devices of a spec that does not
//      list every host device (i.e. not privileged): only the kubelet or containerd's own CDI
//      injection put them there;
//   3. mount markers (/dev/null at /var/run/nvidia-container-devices/<id>): a pod can mount its
//      own hostPath there, so a marker only counts when (1) or (2) names the same GPU — except in
//      a privileged spec, where every host GPU is listed anyway and a marker counts alone;
//   4. NVIDIA_VISIBLE_DEVICES: never, unless the operator opts in with trusted_channels "envvar".
// What an untrusted channel asks for is ignored (and logged), not refused: the container runs
// with no GPU. A trusted channel naming a GPU the node does not have refuses the create, and so
// do (1) and (2) naming different GPUs.
#pragma once

#include <string_view>
#include <vector>

#include "gpu/selector.hpp"
#include "runtime/config.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

// What each channel of one spec says, before it is resolved against the node's GPUs.
struct AllocationChannels {
  bool admits_all_devices = false;       // admits_all_devices(spec): containerd's privileged
  std::vector<DeviceToken> annotations;  // trusted
  // Trusted too: CDI names of a listed kind ([cdi] gpu_kinds), and the GPU minors their specs
  // give (resolve_listed_cdi_kinds fills them in; decide_allocation reads only the minors).
  std::vector<std::string> listed_cdi;
  std::vector<unsigned> listed_cdi_minors;
  std::vector<unsigned> device_minors;  // trusted; only read when !admits_all_devices
  std::vector<DeviceToken> markers;     // corroborating (alone only when admits_all_devices)
  std::vector<DeviceToken> env;         // only read with the envvar opt-in
  bool env_none = false;                // NVIDIA_VISIBLE_DEVICES=none
  std::vector<std::string> ignored;     // what was seen and deliberately not honoured

  bool empty() const {
    return annotations.empty() && listed_cdi.empty() && device_minors.empty() && markers.empty() &&
           env.empty();
  }
  // Whether resolving needs NVML's numbering (indices, "all"), not just the driver's GPU list.
  bool needs_indices() const;
};

// Reads every channel of a spec whose field types check_spec_fields accepted. A malformed id on a
// trusted channel is an error; on an untrusted one it is ignored.
Result<AllocationChannels> read_allocation_channels(const Json& spec, const RuntimeConfig& cfg,
                                                    bool admits_all_devices);

struct Allocation {
  Channel channel = Channel::none;
  std::vector<Gpu> granted;          // in request order, each GPU once
  std::vector<std::string> ignored;  // channels[].ignored plus uncorroborated markers
};

// Decides the granted GPUs from the channels and the node's GPUs.
Result<Allocation> decide_allocation(const AllocationChannels& channels,
                                     const std::vector<Gpu>& inventory);

}  // namespace gpufence
