#include "doctor/parse.hpp"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/device_rules.hpp"

namespace gpufence {
namespace {

bool is_hex64(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c); });
}

}  // namespace

std::optional<std::string> container_id_from_cgroup(std::string_view proc_cgroup) {
  for (std::string_view line : split(proc_cgroup, '\n')) {
    auto colon2 = line.find(':', line.find(':') + 1);
    if (colon2 == std::string_view::npos) continue;
    // The outermost component that names a container: a process inside the container can sit
    // in a cgroup of its own below it (systemd's init.scope, a nested runtime, or a container
    // with a writable cgroupfs hiding in ".../<id>/x"), and it is still that container's.
    for (std::string_view part : split(line.substr(colon2 + 1), '/')) {
      if (part.ends_with(".scope")) part.remove_suffix(6);
      for (std::string_view prefix : {"cri-containerd-", "containerd-", "docker-", "crio-"}) {
        if (part.starts_with(prefix)) part.remove_prefix(prefix.size());
      }
      if (is_hex64(part)) return std::string(part);
    }
  }
  return std::nullopt;
}

std::optional<std::string> cgroup_path(std::string_view proc_cgroup, std::string_view controller) {
  for (std::string_view line : split(proc_cgroup, '\n')) {
    auto c1 = line.find(':');
    auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    if (controller.empty() ? controllers.empty() && line.starts_with("0:") : false)
      return std::string(line.substr(c2 + 1));
    for (std::string_view c : split(controllers, ',')) {
      if (!controller.empty() && c == controller) return std::string(line.substr(c2 + 1));
    }
  }
  return std::nullopt;
}

std::map<std::string, std::string> parse_environ(std::string_view environ) {
  std::map<std::string, std::string> out;
  for (std::string_view entry : split(environ, '\0')) {
    auto eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return out;
}

std::optional<unsigned long long> bounding_caps(std::string_view status) {
  return status_caps(status, "CapBnd");
}

std::optional<unsigned long long> status_caps(std::string_view status, std::string_view field) {
  for (std::string_view line : split(status, '\n')) {
    if (!line.starts_with(field) || line.substr(field.size()).substr(0, 1) != ":") continue;
    std::string_view hex = trim(line.substr(field.size() + 1));
    unsigned long long v = 0;
    auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
    if (ec != std::errc{} || p != hex.data() + hex.size()) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

std::optional<std::set<unsigned>> openable_gpu_minors_from_devices_list(
    std::string_view list, const std::set<unsigned>& gpu_minors) {
  std::set<unsigned> out;
  for (std::string_view line : split(list, '\n')) {
    line = trim(line);
    if (line.empty()) continue;
    auto parts = split(line, ' ');
    if (parts.size() != 3) continue;
    std::string_view type = parts[0], numbers = parts[1], access = parts[2];
    if (type == "a") return std::nullopt;  // allow-all: later denies are not shown on v1
    if (type != "c" || access.find_first_of("rw") == std::string_view::npos) continue;
    auto colon = numbers.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view major = numbers.substr(0, colon), minor = numbers.substr(colon + 1);
    if (major != "*" && major != "195") continue;
    if (minor == "*") return gpu_minors;
    if (auto m = parse_number<unsigned>(minor); m && gpu_minors.contains(*m)) out.insert(*m);
  }
  return out;
}

std::set<unsigned> openable_gpu_minors_from_oci_rules(std::string_view config_json,
                                                      const std::set<unsigned>& gpu_minors) {
  std::set<unsigned> out;
  Json spec;
  try {
    spec = Json::parse(config_json);
  } catch (const Json::exception&) {
    return out;
  }
  // The same reading of the rules the runtime writes them by (runtime/device_rules.hpp).
  auto rules = parse_spec_device_rules(spec);
  if (!rules) return out;
  for (unsigned minor : gpu_minors) {
    if (rules_allow_open(*rules, kNvidiaMajor, minor)) out.insert(minor);
  }
  return out;
}

std::vector<std::string> writable_sysfs_mounts(std::string_view mountinfo) {
  std::vector<std::string> out;
  for (std::string_view line : split(mountinfo, '\n')) {
    // "36 35 0:20 /bus/pci /host-sys rw,relatime shared:1 - sysfs sysfs rw": six fields, optional
    // fields, "-", then type, source and the superblock's options.
    auto fields = split(trim(line), ' ');
    auto dash = std::find(fields.begin(), fields.end(), std::string_view("-"));
    if (fields.size() < 6 || dash == fields.end() || dash - fields.begin() < 6 ||
        fields.end() - dash < 2)
      continue;
    if (*(dash + 1) != "sysfs") continue;
    auto options = split(fields[5], ',');
    if (std::find(options.begin(), options.end(), std::string_view("rw")) == options.end())
      continue;
    out.push_back(cat(fields[4], " (sysfs ", fields[3], ")"));
  }
  return out;
}

std::vector<GpuIdKey> deepstream_gpu_ids(std::string_view config) {
  std::vector<GpuIdKey> out;
  std::string section;
  int line_no = 0;
  for (std::string_view line : split(config, '\n')) {
    ++line_no;
    line = trim(line);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.size() >= 2 && line.front() == '[' && line.back() == ']') {
      section = std::string(line.substr(1, line.size() - 2));
      continue;
    }
    auto eq = line.find('=');
    if (eq == std::string_view::npos || trim(line.substr(0, eq)) != "gpu-id") continue;
    std::string_view value = trim(line.substr(eq + 1));
    if (auto hash = value.find('#'); hash != std::string_view::npos)
      value = trim(value.substr(0, hash));
    if (auto v = parse_number<int>(value)) out.push_back({section, *v, line_no});
  }
  return out;
}

}  // namespace gpufence
