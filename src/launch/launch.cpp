#include "launch/launch.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "common/strings.hpp"
#include "gpu/selector.hpp"
#include "runtime/isolation.hpp"

namespace gpufence {
namespace {

// A UUID list ("GPU-a,GPU-b"), or nullopt when the value is anything else (all, indices, ...).
std::optional<std::vector<std::string>> uuid_list(const std::string& value) {
  auto sel = parse_device_selector(value);
  if (!sel || sel->kind != DeviceSelector::Kind::list) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& t : sel->tokens) {
    if (t.kind != DeviceToken::Kind::uuid) return std::nullopt;
    out.push_back(t.text.starts_with(std::string(kCdiKind) + "=")
                      ? t.text.substr(kCdiKind.size() + 1)
                      : t.text);
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> allocated_uuids(const std::map<std::string, std::string>& env,
                                                 const std::vector<std::string>& marker_names) {
  for (const char* key : {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}) {
    if (auto it = env.find(key); it != env.end()) {
      if (auto uuids = uuid_list(it->second)) return *uuids;
    }
  }
  std::vector<std::string> out;
  for (const auto& name : marker_names) {
    if (name.starts_with("GPU-")) out.push_back(name);
  }
  if (!out.empty()) return out;
  return fail(
      Errc::not_found,
      "no allocated GPU found: expected GPU UUIDs in CUDA_VISIBLE_DEVICES or "
      "NVIDIA_VISIBLE_DEVICES, or "
      "mount markers in /var/run/nvidia-container-devices (does the pod request nvidia.com/gpu?)");
}

size_t openable_gpu_count(const HostFs& host) {
  size_t count = 0;
  auto names = host.list("/dev");
  if (!names) return 0;
  for (const auto& n : *names) {
    if (!gpu_node_minor("/dev/" + n)) continue;
    int fd = ::open(host.resolve("/dev/" + n).c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0 || errno == ENXIO) ++count;
    if (fd >= 0) ::close(fd);
  }
  return count;
}

Result<Rewrite> rewrite_gpu_ids(std::string_view config, size_t allocated,
                                std::string_view origin) {
  Rewrite out;
  int line_no = 0;
  std::vector<std::string_view> lines = split(config, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    ++line_no;
    std::string_view line = lines[i];
    std::string_view t = trim(line);
    auto eq = t.find('=');
    std::string_view key = eq == std::string_view::npos ? t : trim(t.substr(0, eq));
    if (!t.empty() && t.front() != '#' && eq != std::string_view::npos) {
      std::string_view value = trim(t.substr(eq + 1));
      if (auto hash = value.find('#'); hash != std::string_view::npos)
        value = trim(value.substr(0, hash));
      if (key == "gpu-id") {
        auto id = parse_number<long>(value);
        if (!id)
          return fail(Errc::parse, origin, ":", line_no, ": gpu-id '", value, "' is not a number");
        long target = allocated == 1 ? 0 : *id;
        if (target < 0 || static_cast<size_t>(target) >= allocated) {
          return fail(Errc::invalid_argument, origin, ":", line_no, ": gpu-id=", *id,
                      " but the container was allocated ", allocated,
                      " GPU(s) (gpu-id counts them from 0)");
        }
        if (target != *id) ++out.changed;
        size_t indent = line.find_first_not_of(" \t");
        out.text +=
            cat(line.substr(0, indent == std::string_view::npos ? 0 : indent), "gpu-id=", target);
        if (i + 1 < lines.size()) out.text += '\n';
        continue;
      }
      if (key == "config-file") out.referenced.emplace_back(value);
    }
    out.text += line;
    if (i + 1 < lines.size()) out.text += '\n';
  }
  return out;
}

std::string rename_config_refs(std::string_view config,
                               const std::map<std::string, std::string>& renames) {
  std::string out;
  std::vector<std::string_view> lines = split(config, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    std::string_view t = trim(line);
    auto eq = t.find('=');
    if (eq != std::string_view::npos && trim(t.substr(0, eq)) == "config-file") {
      std::string value(trim(t.substr(eq + 1)));
      if (auto it = renames.find(value); it != renames.end()) {
        size_t indent = line.find_first_not_of(" \t");
        out += cat(line.substr(0, indent == std::string_view::npos ? 0 : indent),
                   "config-file=", it->second);
        if (i + 1 < lines.size()) out += '\n';
        continue;
      }
    }
    out += line;
    if (i + 1 < lines.size()) out += '\n';
  }
  return out;
}

}  // namespace gpufence
