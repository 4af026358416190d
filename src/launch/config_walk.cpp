#include "launch/config_walk.hpp"

#include <set>

#include "common/file.hpp"
#include "launch/launch.hpp"

namespace gpufence {

namespace fs = std::filesystem;

namespace {

// nvinfer configs name others only a level or two down; past this a reference loop or a
// generated chain is cut off rather than followed.
constexpr int kMaxDepth = 4;

class LocalConfigFiles final : public ConfigFiles {
 public:
  Result<std::string> read(const fs::path& path) override { return read_file(path); }
  bool exists(const fs::path& path) override { return fs::exists(path); }
  Status replace(const fs::path& path, const std::string& text) override {
    return write_file_atomic(path, text);
  }
  Status write_copy(const fs::path& path, const std::string& text) override {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);  // a failure shows in the write
    return write_file_atomic(path, text, Durability::none);
  }
};

struct Walk {
  ConfigFiles& files;
  size_t allocated;
  fs::path copy_dir;
  std::set<std::string> done;
  ConfigRewrites out;
};

// Rewrites `path` and the nvinfer configs it references (children first, so the parent can point
// at their copies). A read-only file (a ConfigMap) is written to a copy instead.
Status rewrite_config(Walk& walk, const fs::path& path, int depth) {
  if (depth > kMaxDepth || walk.done.contains(path.string())) return {};
  walk.done.insert(path.string());
  auto text = walk.files.read(path);
  if (!text) return std::unexpected(text.error());
  const ConfigFormat format = config_format(path.string());
  auto rw = rewrite_gpu_ids(format, *text, walk.allocated, path.string());
  if (!rw) return std::unexpected(rw.error());
  std::map<std::string, std::string> renames;
  for (const auto& ref : rw->referenced) {
    fs::path child = fs::path(ref).is_absolute() ? fs::path(ref) : path.parent_path() / ref;
    if (!walk.files.exists(child)) continue;  // DeepStream reports its own missing files
    if (auto st = rewrite_config(walk, child, depth + 1); !st) return st;
    if (auto it = walk.out.copies.find(child.string()); it != walk.out.copies.end())
      renames[ref] = it->second;
  }
  std::string out = rw->text;
  if (!renames.empty()) {
    auto renamed = rename_config_refs(format, rw->text, renames, path.string());
    if (!renamed) return std::unexpected(renamed.error());
    out = *renamed;
  }
  walk.out.rewritten += rw->changed;
  if (out == *text) return {};
  if (auto st = walk.files.replace(path, out); st) return {};
  // Not writable here: keep the rewritten text in a copy and point users of the file at it.
  auto copy =
      walk.copy_dir / (std::to_string(walk.out.copies.size()) + "-" + path.filename().string());
  if (auto st = walk.files.write_copy(copy, out); !st) return st;
  walk.out.copies[path.string()] = copy.string();
  return {};
}

}  // namespace

std::unique_ptr<ConfigFiles> local_config_files() {
  return std::make_unique<LocalConfigFiles>();
}

Result<ConfigRewrites> rewrite_configs(const std::vector<std::string>& configs, size_t allocated,
                                       const fs::path& copy_dir, ConfigFiles& files) {
  Walk walk{files, allocated, copy_dir, {}, {}};
  for (const auto& c : configs) {
    if (auto st = rewrite_config(walk, c, 0); !st) return std::unexpected(st.error());
  }
  return std::move(walk.out);
}

std::vector<std::string> point_at_copies(std::vector<std::string> argv,
                                         const ConfigRewrites& rewrites) {
  for (auto& a : argv) {
    if (auto it = rewrites.copies.find(a); it != rewrites.copies.end()) a = it->second;
  }
  return argv;
}

}  // namespace gpufence
