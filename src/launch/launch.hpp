// `gpufence launch`: a container entrypoint for DeepStream. It finds the GPUs the container was
// allocated, refuses to start when it can open more than those (isolation is broken and the app
// would pick GPU 0 of the node: the seed's symptom), rewrites the DeepStream configs' gpu-id
// keys to count within the allocation, pins CUDA_VISIBLE_DEVICES to the allocated UUIDs, and
// execs the app.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

// The allocated GPUs' UUIDs: CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES when they name UUIDs,
// else the kubelet's mount markers (entries of /var/run/nvidia-container-devices).
Result<std::vector<std::string>> allocated_uuids(const std::map<std::string, std::string>& env,
                                                 const std::vector<std::string>& marker_names);

// How many /dev/nvidiaN this process can open (ENXIO counts: a node with no driver behind it is
// still admitted by the devices cgroup).
size_t openable_gpu_count(const HostFs& host);

struct Rewrite {
  std::string text;
  int changed = 0;                      // gpu-id keys rewritten
  std::vector<std::string> referenced;  // config-file= values (nvinfer configs), as written
};

// Rewrites every "gpu-id=N" so it indexes the `allocated` GPUs CUDA shows the container: with
// one GPU every key becomes 0; with several, a key past the end is an error naming its line.
Result<Rewrite> rewrite_gpu_ids(std::string_view config, size_t allocated, std::string_view origin);

// Replaces the value of "config-file=" keys found in `renames` (old path as written -> new path).
std::string rename_config_refs(std::string_view config,
                               const std::map<std::string, std::string>& renames);

}  // namespace gpufence
