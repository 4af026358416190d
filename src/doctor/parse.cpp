#include "doctor/parse.hpp"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "common/strings.hpp"

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
    std::string_view path = line.substr(colon2 + 1);
    auto slash = path.rfind('/');
    std::string_view last = slash == std::string_view::npos ? path : path.substr(slash + 1);
    if (last.ends_with(".scope")) last.remove_suffix(6);
    for (std::string_view prefix : {"cri-containerd-", "containerd-", "docker-", "crio-"}) {
      if (last.starts_with(prefix)) last.remove_prefix(prefix.size());
    }
    if (is_hex64(last)) return std::string(last);
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
  for (std::string_view line : split(status, '\n')) {
    if (!line.starts_with("CapBnd:")) continue;
    std::string_view hex = trim(line.substr(7));
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
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::exception&) {
    return out;
  }
  const auto* rules = &spec;
  for (const char* key : {"linux", "resources", "devices"}) {
    if (!rules->is_object() || !rules->contains(key)) return out;
    rules = &(*rules)[key];
  }
  if (!rules->is_array()) return out;
  for (unsigned minor : gpu_minors) {
    bool allowed = false;  // runc starts from deny-all
    for (const auto& r : *rules) {
      if (!r.is_object()) continue;
      // A mistyped allow/access (runc refuses such a spec) is skipped: value() would throw out of
      // the doctor. Found by tests/fuzz/fuzz_doctor_parse.cpp.
      if ((r.contains("access") && !r["access"].is_string()) ||
          (r.contains("allow") && !r["allow"].is_boolean()))
        continue;
      auto t = r.find("type");
      bool all = t == r.end() || !t->is_string() || t->get_ref<const std::string&>().empty() ||
                 t->get_ref<const std::string&>() == "a";
      // Any "a" rule resets the list to allow-all or deny-all, whatever its numbers and access
      // (runc 1.1's devices emulator, measured: docs/fuzzing.md). Found by fuzz_oci_spec.cpp.
      if (all) {
        allowed = r.value("allow", false);
        continue;
      }
      if (t->get_ref<const std::string&>() != "c") continue;
      auto num = [&](const char* k) -> long {
        return r.contains(k) && r[k].is_number_integer() ? r[k].get<long>() : -1;
      };
      long major = num("major"), mnr = num("minor");
      if ((major != -1 && major != 195) || (mnr != -1 && mnr != static_cast<long>(minor))) continue;
      std::string access = r.value("access", std::string("rwm"));
      if (access.find_first_of("rw") == std::string::npos) continue;
      allowed = r.value("allow", false);
    }
    if (allowed) out.insert(minor);
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
