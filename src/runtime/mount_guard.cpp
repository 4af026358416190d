#include "runtime/mount_guard.hpp"

#include <algorithm>
#include <functional>

#include "common/strings.hpp"

namespace gpufence {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo (proc(5)).
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      auto oct = s.substr(i + 1, 3);
      if (oct.size() == 3 &&
          std::all_of(oct.begin(), oct.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out += static_cast<char>((oct[0] - '0') * 64 + (oct[1] - '0') * 8 + (oct[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

bool within(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

}  // namespace

std::vector<std::string> cgroup_mount_points(std::string_view mountinfo) {
  std::vector<std::string> out;
  for (std::string_view line : split(mountinfo, '\n')) {
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    auto dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    auto fields = split(line.substr(0, dash), ' ');
    auto after = split(line.substr(dash + 3), ' ');
    if (fields.size() < 5 || after.empty()) continue;
    if (after[0] == "cgroup" || after[0] == "cgroup2") out.push_back(unescape(fields[4]));
  }
  return out;
}

Status refuse_cgroupfs_binds(const Json& spec, const std::vector<std::string>& cgroup_mounts,
                             const std::function<std::string(const std::string&)>& resolve) {
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array() || cgroup_mounts.empty()) return {};
  for (const auto& m : *mounts) {
    if (!m.is_object()) continue;
    bool bind = m.value("type", "") == "bind", recursive = false;
    if (auto opts = m.find("options"); opts != m.end() && opts->is_array()) {
      for (const auto& o : *opts) {
        bind |= o == "bind" || o == "rbind";
        recursive |= o == "rbind";
      }
    }
    std::string source = m.value("source", "");
    if (!bind || source.empty() || source.front() != '/') continue;
    std::string host = resolve(source);
    for (const auto& cg : cgroup_mounts) {
      if (within(host, cg) || (recursive && within(cg, host))) {
        return fail(
            Errc::denied, "mount ", m.value("destination", "?"), " binds ", source,
            within(host, cg) ? ", a cgroup filesystem" : ", which holds a cgroup filesystem",
            ": a container could move itself out of its devices cgroup and open every "
            "GPU (docs/trust-model.md)");
      }
    }
  }
  return {};
}

}  // namespace gpufence
