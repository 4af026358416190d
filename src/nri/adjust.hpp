// gpufence-nri's decision: the container NRI shows, as the OCI spec the shim would read; the shim's
// own edit of it (runtime/shim.hpp edit_spec: one decision, two enforcement points); the edit
// written back as the ContainerAdjustment containerd applies. docs/nri.md.
//
// What the spec is built from (containerd internal/cri/nri/nri_api_linux.go, docs/nri.md):
// - annotations: the container's (OCI spec + CRI container annotations), minus every key the pod
//   sandbox also carries: a pod annotation that a broad pod_annotations let into the container is
//   the pod's word, not the device plugin's;
// - the CDI device names the kubelet sent in CRI's CDIDevices (containerd 2.3+), as one CDI
//   annotation (the same trusted channel as the device plugin's CDI annotations);
// - env, mounts, hooks, linux.devices and linux.resources.devices as CRI (and CDI) made them.
// How the edit becomes an adjustment, and what it cannot carry (nri@v0.12.0:pkg/adaptation/
// result.go, pkg/runtime-tools/generate/generate.go):
// - env, device nodes and mounts are set by key (replacing); removals are sent as "-key" markers
//   but containerd does not forward a device's or env's removal to the spec;
// - a changed device cgroup list is appended as "deny all" + the shim's list: the runtime applies
//   rules in order, so the appended list decides (NRI >= v0.10 only; older ones ignore it);
// - hooks can only be appended.
// Where a promise cannot be kept the result says so: an unprivileged container that would keep a
// GPU node or rule it must lose is refused; a privileged one is let through with the gap logged
// (the installer pairs gpufence-nri with the shim for those on runtimes below NRI v0.10).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nri/service.hpp"
#include "nri/status.hpp"
#include "runtime/shim.hpp"

namespace gpufence::nri {

// The annotation gpufence-nri puts the CRI CDIDevices names under (a trusted CDI prefix).
inline constexpr std::string_view kCriCdiDevicesAnnotation =
    "cdi.k8s.io/gpufence-nri.cri-cdi-devices";

// The most a container may hold for gpufence-nri to decide it; above any, the creation is refused
// before anything is copied (docs/nri.md, "Limits"). Real pods stay far below: these bound the
// work and memory one pod spec can cost the plugin every other pod waits on.
struct RequestLimits {
  size_t mounts = 1024;
  size_t devices = 1024;
  size_t device_rules = 1024;
  size_t env = 16384;
  size_t hooks = 256;
  size_t annotation_bytes = 1u << 20;  // keys and values, the pod's and the container's
  size_t path_bytes = 4096;  // a mount's destination or source, a device's path (PATH_MAX)
};

// Why the request is over a limit (the limit named), or ok.
Status check_request_limits(const api::PodSandbox& pod, const api::Container& container,
                            const RequestLimits& limits = {});

// A key the decision reads (a trusted annotation prefix, or gpufence-nri's own mark) that the pod
// also carries: containerd's pod_annotations may have copied the pod's value into the
// container, and the two cannot be told apart, so the creation is refused (never a key dropped).
Status refuse_shared_trusted_annotations(const api::PodSandbox& pod,
                                         const api::Container& container,
                                         const std::vector<std::string>& trusted_prefixes);

// The OCI-spec-shaped JSON of what NRI shows about a container.
Json container_spec(const api::PodSandbox& pod, const api::Container& container);

struct NriDecision {
  ShimDecision shim;
  api::ContainerAdjustment adjust;
  std::string rules;  // "unchanged", "appended" or "not-applied" (runtime below NRI v0.10)
  std::vector<std::string> gaps;  // promises this runtime cannot keep for this container
  bool edited = false;      // the adjustment changes the container (beyond gpufence-nri's mark)
  bool node_agent = false;  // in a node agent namespace: left as containerd made it
};

// Decides for one container; an error means the creation must fail. Every adjustment (an empty
// decision too) sets kDecidedAnnotation to the container's id: the fence lets through only
// containers that carry it, and a later Synchronize reads it (a pod cannot know the id that
// containerd generates, so no pod annotation can stand for it). Past `deadline` the decision
// stops between steps and refuses.
Result<NriDecision> decide_container(const api::PodSandbox& pod, const api::Container& container,
                                     const RuntimeInfo& runtime, ShimContext& ctx,
                                     std::optional<SteadyTime> deadline = std::nullopt);

// What a Synchronize shows: containerd's containers that carry no decision of gpufence-nri's
// (created while it was down, or before it was installed), judged by deciding each again as if
// it were being created. Stopped containers hold no device and are not judged.
struct SyncJudgement {
  int64_t containers = 0;
  int64_t without_gpu_edit = 0;  // undecided, but the decision changes no GPU access
  std::vector<UnenforcedContainer> unenforced;
};
// Each container's judgement gets `budget` (0: none), as a creation does; one that runs out is
// listed as not judged (never dropped).
SyncJudgement judge_synchronized(const std::vector<api::PodSandbox>& pods,
                                 const std::vector<api::Container>& containers,
                                 const RuntimeInfo& runtime, ShimContext& ctx,
                                 std::chrono::milliseconds budget = {});

}  // namespace gpufence::nri
