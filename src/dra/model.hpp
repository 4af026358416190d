// What gpufence-dra publishes and prepares, as pure functions of the GPUs and the API objects:
// the node's ResourceSlice, the devices of a ResourceClaim that are ours, the checkpoint of
// prepared claims. Facts (fields, limits, the kubelet's calls): docs/dra.md.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "gpu/gpu.hpp"

namespace gpufence {

// The DRA driver name: ResourceSlice.spec.driver, the results' driver, the plugin's name.
inline constexpr std::string_view kDraDriverName = "gpufence.io";

struct DraIdentity {
  std::string driver = std::string(kDraDriverName);
  std::string node;  // the node name; also the pool's name (one pool per node)
};

// A GPU's health as the slice and the health stream say it. Unhealthy devices carry the taint
// kDraUnhealthyTaintKey: NoSchedule (no new allocation), NoExecute when the GPU is lost or its XID
// is one the policy names (pods using it are evicted by the device taint controller).
struct DraDeviceHealth {
  bool healthy = true;
  std::string reason;  // "xid 48", "lost: ..." (the device plugin's HealthTracker)
  bool no_execute = false;
};
inline constexpr std::string_view kDraUnhealthyTaintKey = "gpufence.io/unhealthy";
// XIDs whose GPU is evicted, not only kept from new pods, by default: 79 (fallen off the bus).
inline const std::set<std::uint64_t> kDraNoExecuteXids = {79};

// The health a reason from HealthTracker means under the NoExecute policy.
DraDeviceHealth dra_health_of(bool healthy, const std::string& reason,
                              const std::set<std::uint64_t>& no_execute_xids);
// The taint's value for a reason: a label value ("xid-48", "lost"), at most 63 characters.
std::string dra_taint_value(std::string_view reason);

// The device name of a GPU in the slice: "gpu-<minor>" (a DNS label; the minor names its node).
std::string dra_device_name(const Gpu& gpu);

// The ResourceSlice (resource.k8s.io/v1) for the node's GPUs: one pool named after the node, one
// device per GPU with uuid, index, minor, productName, pciBusID, driverVersion, numaNode as
// attributes (so CEL selectors work) and memory as capacity. `generation` is the pool's. A GPU
// whose uuid `health` names unhealthy carries the unhealthy taint.
nlohmann::json dra_resource_slice(const DraIdentity& id, const std::vector<Gpu>& gpus,
                                  std::int64_t generation,
                                  const std::map<std::string, DraDeviceHealth>& health = {});
// The slice's object name: "<node>-gpufence.io"; for a node name too long for that, its start, a
// hash of the whole name and the driver (at most 253 characters, distinct per node).
std::string dra_slice_name(const DraIdentity& id);
// Whether two slices say the same to the scheduler (spec only; metadata and status aside).
bool dra_same_slice_spec(const nlohmann::json& a, const nlohmann::json& b);

// One device of a claim prepared for a container: the request it satisfies and its CDI name.
struct DraPreparedDevice {
  std::string request;
  std::string pool;
  std::string device;
  std::string cdi_id;  // "gpufence.io/gpu=<uuid>": the device plugin's kind, enforced by NRI
  bool operator==(const DraPreparedDevice&) const = default;
};

struct DraPreparedClaim {
  std::string uid, claim_namespace, name;
  std::vector<DraPreparedDevice> devices;
  bool operator==(const DraPreparedClaim&) const = default;
};

// The devices of `claim` (a ResourceClaim as the API server returns it) allocated from this
// driver: each result whose driver is ours must name our pool and a GPU of ours, or the claim is
// refused (an allocation made for another node, or a GPU gone since). Checks that the object is
// the claim the kubelet named (uid) and that it is allocated.
Result<DraPreparedClaim> dra_claim_devices(const nlohmann::json& claim, std::string_view uid,
                                           const DraIdentity& id, const std::vector<Gpu>& gpus);

// The checkpoint of prepared claims, by claim UID (JSON, versioned).
std::string dra_checkpoint_text(const std::map<std::string, DraPreparedClaim>& claims);
Result<std::map<std::string, DraPreparedClaim>> dra_parse_checkpoint(std::string_view text);

}  // namespace gpufence
