#include "runtime/mount_guard.hpp"

#include <algorithm>
#include <functional>

#include "common/escape.hpp"
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

std::vector<MountInfoEntry> parse_mountinfo(std::string_view mountinfo) {
  std::vector<MountInfoEntry> out;
  for (std::string_view line : split(mountinfo, '\n')) {
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    // (proc(5)): id, parent, major:minor, root, mount point, per-mount options, optional
    // fields, "-", filesystem type, source, super-block options.
    auto dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    auto fields = split(line.substr(0, dash), ' ');
    auto after = split(line.substr(dash + 3), ' ');
    if (fields.size() < 6 || after.empty()) continue;
    out.push_back(
        {unescape(fields[3]), unescape(fields[4]), std::string(fields[5]), std::string(after[0])});
  }
  return out;
}

std::vector<std::string> cgroup_mount_points(std::string_view mountinfo) {
  std::vector<std::string> out;
  for (const auto& m : parse_mountinfo(mountinfo))
    if (m.is_cgroupfs()) out.push_back(m.mount_point);
  return out;
}

bool MountInfoEntry::read_only() const {
  for (std::string_view o : split(options, ','))
    if (o == "ro") return true;
  return false;
}

Result<bool> pin_private_propagation(Json& spec) {
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array()) return false;
  bool changed = false;
  for (auto& m : *mounts) {
    if (!m.is_object()) continue;
    bool bind = m.value("type", "") == "bind";
    Json& options = ensure_array(m, "options");
    bool has_propagation = false;
    for (const auto& o : options) {
      if (!o.is_string()) continue;
      std::string opt = o.get<std::string>();
      bind |= opt == "bind" || opt == "rbind";
      if (opt == "shared" || opt == "rshared" || opt == "slave" || opt == "rslave") {
        return fail(Errc::denied, "mount ", escape_excerpt(m.value("destination", "?")),
                    " asks for ", opt,
                    " propagation: a mount made later on the host below its source (a cgroup "
                    "filesystem among them) would appear in the container after its mounts were "
                    "checked; use mountPropagation: None (docs/trust-model.md)");
      }
      has_propagation |=
          opt == "private" || opt == "rprivate" || opt == "unbindable" || opt == "runbindable";
    }
    if (bind && !has_propagation) {
      options.push_back("rprivate");
      changed = true;
    }
    if (options.empty()) m.erase("options");
  }
  return changed;
}

bool may_mount_a_cgroupfs(const Json& spec) {
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array()) return false;
  for (const auto& m : *mounts) {
    if (!m.is_object()) continue;
    std::string type = m.value("type", "");
    if (type == "bind") return true;
    if ((type == "cgroup" || type == "cgroup2") && m.value("destination", "") != "/sys/fs/cgroup")
      return true;
    if (auto opts = m.find("options"); opts != m.end() && opts->is_array()) {
      for (const auto& o : *opts)
        if (o == "bind" || o == "rbind") return true;
    }
  }
  return false;
}

Status check_container_cgroup_mounts(std::string_view mountinfo, const std::string& rootfs,
                                     CgroupNamespace cgroupns) {
  const std::string own = (rootfs == "/" ? std::string() : rootfs) + "/sys/fs/cgroup";
  for (const auto& m : parse_mountinfo(mountinfo)) {
    if (!m.is_cgroupfs() || !within(m.mount_point, rootfs)) continue;
    std::string where = rootfs == "/" ? m.mount_point : m.mount_point.substr(rootfs.size());
    // The runtime's own: /sys/fs/cgroup itself (cgroup2, or v1's tmpfs) or one v1 hierarchy
    // right below it.
    bool at_own_place =
        m.mount_point == own || (within(m.mount_point, own) &&
                                 m.mount_point.find('/', own.size() + 1) == std::string::npos);
    // Its root is the container's own cgroup: never a hierarchy's root without a cgroup
    // namespace (runc binds the container's cgroup directory on v1), never above the
    // namespace's root with one (shown as "/.." by the kernel).
    bool foreign_root = m.root.starts_with("/..") || (cgroupns == CgroupNamespace::host &&
                                                      m.fstype == "cgroup" && m.root == "/");
    std::string why = !at_own_place    ? "a cgroup filesystem mounted at " + where
                      : !m.read_only() ? "a writable cgroup filesystem at " + where
                      : foreign_root   ? "the cgroup hierarchy's " + m.root + " at " + where
                                       : "";
    if (why.empty()) continue;
    return fail(Errc::denied, "the container's mounts hold ", escape_excerpt(why), " (", m.fstype,
                " ", escape_excerpt(m.root),
                "): it could move itself out of its devices cgroup and open every GPU, so it does "
                "not start (docs/trust-model.md)");
  }
  return {};
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
            Errc::denied, "mount ", escape_excerpt(m.value("destination", "?")), " binds ",
            escape_excerpt(source),
            within(host, cg) ? ", a cgroup filesystem" : ", which holds a cgroup filesystem",
            ": a container could move itself out of its devices cgroup and open every "
            "GPU (docs/trust-model.md)");
      }
    }
  }
  return {};
}

}  // namespace gpufence
