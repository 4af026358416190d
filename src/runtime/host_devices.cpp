#include "runtime/host_devices.hpp"

#include <algorithm>
#include <cctype>

#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

Result<ProcDevices> parse_proc_devices(std::string_view text) {
  ProcDevices out;
  std::vector<RegisteredMajor>* section = nullptr;
  int line_no = 0;
  for (std::string_view line : split(text, '\n')) {
    ++line_no;
    line = trim(line);
    if (line.empty()) continue;
    if (line == "Character devices:") {
      section = &out.character;
      continue;
    }
    if (line == "Block devices:") {
      section = &out.block;
      continue;
    }
    auto space = line.find_first_of(" \t");
    auto major = parse_number<unsigned>(line.substr(0, space));
    if (!section || space == std::string_view::npos || !major)
      return fail(Errc::parse, "/proc/devices line ", line_no, ": '", line, "'");
    section->push_back({*major, std::string(trim(line.substr(space)))});
  }
  if (out.character.empty()) return fail(Errc::parse, "/proc/devices lists no character devices");
  return out;
}

std::set<unsigned> nvidia_reserved_majors(const ProcDevices& devices) {
  std::set<unsigned> out = {kNvidiaMajor, kDrmMajor};
  for (const auto& m : devices.character) {
    if (m.name.starts_with("nvidia")) out.insert(m.major);
  }
  return out;
}

namespace {

bool is_drm_node_name(std::string_view name) {
  std::string_view digits;
  if (name.starts_with("card"))
    digits = name.substr(4);
  else if (name.starts_with("renderD"))
    digits = name.substr(7);
  else
    return false;
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

}  // namespace

std::vector<DrmNode> read_drm_nodes(const HostFs& host) {
  std::vector<DrmNode> out;
  auto names = host.list("/sys/class/drm");
  if (!names) return out;
  for (const auto& name : *names) {
    if (!is_drm_node_name(name)) continue;
    const std::string base = "/sys/class/drm/" + name;
    auto dev = host.read(base + "/dev");  // "226:1\n"
    if (!dev) continue;
    auto colon = dev->find(':');
    if (colon == std::string::npos) continue;
    auto major = parse_number<unsigned>(trim(std::string_view(*dev).substr(0, colon)));
    auto minor = parse_number<unsigned>(trim(std::string_view(*dev).substr(colon + 1)));
    if (!major || !minor || *major != kDrmMajor) continue;
    DrmNode node{name, *minor, "", false};
    if (auto link = host.read_link(base + "/device")) {
      auto slash = link->find_last_of('/');
      node.pci_bus_id = to_lower(slash == std::string::npos ? *link : link->substr(slash + 1));
    }
    if (auto vendor = host.read(base + "/device/vendor")) node.nvidia = trim(*vendor) == "0x10de";
    out.push_back(std::move(node));
  }
  return out;
}

Result<DeviceNode> host_char_device(const HostFs& host, const std::string& path) {
  auto info = host.stat(path);
  if (!info) return std::unexpected(info.error());
  if (info->type != FileType::char_device) {
    return fail(Errc::not_found, host.resolve(path).native(), " is not a character device");
  }
  return DeviceNode{path, info->major, info->minor};
}

Result<DeviceNode> HostDeviceFacts::char_device(const std::string& host_path,
                                                const std::string& container_path) const {
  auto it = char_nodes.find(host_path);
  if (it == char_nodes.end())
    return fail(Errc::not_found, host_path, ": its device numbers were not read for this decision");
  if (!it->second) return std::unexpected(it->second.error());
  return DeviceNode{container_path, it->second->major, it->second->minor};
}

HostDeviceFacts read_host_device_facts(const HostFs& host, const HostDeviceQuery& query) {
  HostDeviceFacts facts;
  auto text = host.read("/proc/devices");
  facts.registered =
      text ? parse_proc_devices(*text) : Result<ProcDevices>(std::unexpected(text.error()));
  for (const auto& path : query.char_paths)
    facts.char_nodes.emplace(path, host_char_device(host, path));
  if (query.drm_nodes) facts.drm_nodes = read_drm_nodes(host);
  return facts;
}

}  // namespace gpufence
