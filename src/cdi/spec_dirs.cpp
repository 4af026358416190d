#include "cdi/spec_dirs.hpp"

#include <algorithm>
#include <map>

#include "common/strings.hpp"

namespace gpufence {

std::vector<CdiSourceFile> read_cdi_spec_files(const HostFs& fs,
                                               const std::vector<std::string>& dirs) {
  std::vector<CdiSourceFile> out;
  for (size_t priority = 0; priority < dirs.size(); ++priority) {
    std::string dir = dirs[priority];
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    auto names = fs.list(dir);
    if (!names) {
      // A missing directory holds no specs (upstream skips ErrNotExist); any other failure is
      // reported as an unreadable entry so the reader can say why nothing came from it.
      if (names.error().code != Errc::not_found)
        out.push_back({dir, priority, std::unexpected(names.error())});
      continue;
    }
    for (const auto& name : *names) {
      // Upstream's filter is the extension alone: ".yml" files are not specs to containerd.
      if (!name.ends_with(".json") && !name.ends_with(".yaml")) continue;
      std::string path = dir == "/" ? "/" + name : dir + "/" + name;
      // Subdirectories are skipped; a symlink to a file is read through (filepath.Walk, lstat).
      if (auto info = fs.stat(path); info && info->type == FileType::directory) continue;
      out.push_back({path, priority, fs.read(path)});
    }
  }
  return out;
}

Result<CdiSpecSet> parse_cdi_spec_files(const std::vector<CdiSourceFile>& files,
                                        const std::vector<std::string_view>& kinds) {
  CdiSpecSet set;
  for (const auto& file : files) {
    if (!file.text) {
      set.skipped.push_back({file.path, CdiSkip::unreadable, file.text.error().message});
      continue;
    }
    // Read the kind first: only a file that says it is `kind` is judged.
    auto doc = parse_cdi_document(*file.text, file.path);
    if (!doc) {
      set.skipped.push_back({file.path, CdiSkip::unreadable, doc.error().message});
      continue;
    }
    auto file_kind = cdi_document_kind(*doc);
    if (!file_kind) {
      set.skipped.push_back({file.path, CdiSkip::unreadable, "no kind"});
      continue;
    }
    if (std::find(kinds.begin(), kinds.end(), *file_kind) == kinds.end()) {
      set.skipped.push_back({file.path, CdiSkip::other_kind, *file_kind});
      continue;
    }
    auto spec = decode_cdi_spec(*doc, file.path);
    if (!spec) return std::unexpected(spec.error().wrap("malformed CDI spec"));
    set.specs.push_back({file.path, std::move(*spec), file.priority});
  }
  return set;
}

Result<CdiSpecSet> load_cdi_spec_dirs(const HostFs& fs, const std::vector<std::string>& dirs,
                                      const std::vector<std::string_view>& kinds) {
  return parse_cdi_spec_files(read_cdi_spec_files(fs, dirs), kinds);
}

std::vector<CdiFileSummary> summarize_cdi_spec_files(const std::vector<CdiSourceFile>& files) {
  std::vector<CdiFileSummary> out;
  for (const auto& file : files) {
    CdiFileSummary& f = out.emplace_back(CdiFileSummary{file.path, file.priority, "", {}, ""});
    if (!file.text) {
      f.error = file.text.error().message;
      continue;
    }
    auto doc = parse_cdi_document(*file.text, file.path);
    if (!doc) {
      f.error = doc.error().message;
      continue;
    }
    if (auto kind = cdi_document_kind(*doc)) f.kind = *kind;
    auto spec = decode_cdi_spec(*doc, file.path);
    if (!spec) {
      f.error = spec.error().message;
      continue;
    }
    for (const auto& d : spec->devices) f.devices.push_back(d.name);
  }
  return out;
}

namespace {

CdiFileSummary summary_of(const CdiSpecFile& file) {
  CdiFileSummary f{file.path, file.priority, file.spec.kind, {}, ""};
  for (const auto& d : file.spec.devices) f.devices.push_back(d.name);
  return f;
}

}  // namespace

std::vector<CdiDuplicateDevice> duplicate_cdi_devices(const std::vector<CdiFileSummary>& files) {
  // kind=name -> (priority, path) of every file defining it, in reading order. Upstream keys its
  // device map by the qualified name: one name under two kinds is two devices.
  std::map<std::string, std::vector<std::pair<size_t, std::string>>> defined;
  for (const auto& file : files) {
    if (!file.error.empty()) continue;
    for (const auto& d : file.devices)
      defined[cat(file.kind, "=", d)].emplace_back(file.priority, file.path);
  }
  std::vector<CdiDuplicateDevice> out;
  for (const auto& [name, files] : defined) {
    if (files.size() < 2) continue;
    size_t top = 0;
    for (const auto& f : files) top = std::max(top, f.first);
    CdiDuplicateDevice dup;
    dup.name = name;
    for (const auto& [priority, path] : files)
      (priority == top ? dup.winners : dup.ignored).push_back(path);
    dup.resolution = dup.winners.size() > 1 ? CdiDuplicateDevice::Resolution::conflict
                                            : CdiDuplicateDevice::Resolution::overridden;
    out.push_back(std::move(dup));
  }
  return out;
}

std::vector<CdiDuplicateDevice> apply_cdi_priority(std::vector<CdiSpecFile>& specs) {
  std::vector<CdiFileSummary> summaries;
  for (const auto& file : specs) summaries.push_back(summary_of(file));
  auto duplicates = duplicate_cdi_devices(summaries);
  std::vector<CdiDuplicateDevice> removed;
  for (const auto& dup : duplicates) {
    if (dup.ignored.empty()) continue;
    for (auto& file : specs) {
      if (std::find(dup.ignored.begin(), dup.ignored.end(), file.path) == dup.ignored.end())
        continue;
      auto& devs = file.spec.devices;
      devs.erase(std::remove_if(devs.begin(), devs.end(),
                                [&](const CdiDevice& d) {
                                  return cat(file.spec.kind, "=", d.name) == dup.name;
                                }),
                 devs.end());
    }
    removed.push_back(dup);
  }
  return removed;
}

}  // namespace gpufence
