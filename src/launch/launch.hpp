// `gpufence launch`: a container entrypoint for DeepStream. It finds the GPUs the container was
// allocated, refuses to start when it can open more than those (isolation is broken and the app
// would pick GPU 0 of the node: the seed's symptom), rewrites the DeepStream configs' gpu-id
// keys to count within the allocation, pins CUDA_VISIBLE_DEVICES to the allocated UUIDs, and
// execs the app. Facts: docs/launch.md.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

// The allocated GPUs' UUIDs, from every source that names them: CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES when they hold UUIDs, and the kubelet's mount markers (entries of
// /var/run/nvidia-container-devices). When two sources name different GPUs the answer is an
// error naming both: which one is right cannot be known here, and guessing could put the app on
// a GPU another pod owns.
Result<std::vector<std::string>> allocated_uuids(const std::map<std::string, std::string>& env,
                                                 const std::vector<std::string>& marker_names);

// How many /dev/nvidiaN this process can open (ENXIO counts: a node with no driver behind it is
// still admitted by the devices cgroup).
size_t openable_gpu_count(const HostFs& host);

// DeepStream reads two config formats: GLib key files (deepstream-app, nvinfer .txt) and YAML
// (nvinfer and the app from DS 6.2 on, chosen by the .yml/.yaml file name ending).
enum class ConfigFormat { key_file, yaml };
ConfigFormat config_format(std::string_view path);

struct Rewrite {
  std::string text;
  int changed = 0;                      // gpu-id values rewritten
  std::vector<std::string> referenced;  // config-file(-path) values (nvinfer configs), as written
};

// Rewrites every gpu-id value so it indexes the `allocated` GPUs CUDA shows the container: with
// one GPU every value becomes 0; with several, a value past the end is an error naming its line.
// Only the value's characters change: a line whose value stays is kept byte for byte, and so are
// the spacing and trailing comment around a changed one.
Result<Rewrite> rewrite_gpu_ids(std::string_view config, size_t allocated, std::string_view origin);
// The same over a YAML document (`property: {gpu-id: 1}`, block or flow style, any depth): yaml-cpp
// finds the values, and the text is edited at their positions, so comments and layout stay.
Result<Rewrite> rewrite_gpu_ids_yaml(std::string_view config, size_t allocated,
                                     std::string_view origin);
Result<Rewrite> rewrite_gpu_ids(ConfigFormat format, std::string_view config, size_t allocated,
                                std::string_view origin);

// Replaces the value of config-file keys found in `renames` (old path as written -> new path),
// keeping the rest of each line.
std::string rename_config_refs(std::string_view config,
                               const std::map<std::string, std::string>& renames);
Result<std::string> rename_config_refs_yaml(std::string_view config,
                                            const std::map<std::string, std::string>& renames,
                                            std::string_view origin);
Result<std::string> rename_config_refs(ConfigFormat format, std::string_view config,
                                       const std::map<std::string, std::string>& renames,
                                       std::string_view origin);

}  // namespace gpufence
