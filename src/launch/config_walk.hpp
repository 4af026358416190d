// `gpufence launch`'s walk over the DeepStream configs it was given: each config and the nvinfer
// configs it names (config-file), children first so a parent can point at their copies, each
// rewritten by rewrite_gpu_ids. A config this process cannot replace (a ConfigMap, read-only) is
// written to a copy under the copy directory instead, and whatever named it (a parent config, the
// app's argv) is pointed at the copy. The files are behind a seam, so tests need no host.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

// The file access the walk needs.
class ConfigFiles {
 public:
  virtual ~ConfigFiles() = default;
  virtual Result<std::string> read(const std::filesystem::path& path) = 0;
  virtual bool exists(const std::filesystem::path& path) = 0;
  // Replaces the file in place; fails where this process cannot (a read-only mount).
  virtual Status replace(const std::filesystem::path& path, const std::string& text) = 0;
  // Writes a file of the walk's own (a copy), creating the directory it lies in.
  virtual Status write_copy(const std::filesystem::path& path, const std::string& text) = 0;
};

// The container's own files: atomic replacement (common/file.hpp), copies without fsync (they
// live only as long as the container).
std::unique_ptr<ConfigFiles> local_config_files();

struct ConfigRewrites {
  std::map<std::string, std::string> copies;  // a config's path -> its rewritten copy
  int rewritten = 0;                          // gpu-id values changed, over every file
};

// Rewrites `configs` and what they reference (at most 4 levels down, each file once) for
// `allocated` GPUs. A reference to a file that does not exist is left for DeepStream to report.
Result<ConfigRewrites> rewrite_configs(const std::vector<std::string>& configs, size_t allocated,
                                       const std::filesystem::path& copy_dir, ConfigFiles& files);

// The app's argv with every config that was copied replaced by its copy.
std::vector<std::string> point_at_copies(std::vector<std::string> argv,
                                         const ConfigRewrites& rewrites);

}  // namespace gpufence
