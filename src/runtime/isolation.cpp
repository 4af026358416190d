#include "runtime/isolation.hpp"

#include <algorithm>

#include "common/strings.hpp"

namespace gpufence {

std::optional<unsigned> gpu_node_minor(std::string_view path) {
  constexpr std::string_view prefix = "/dev/nvidia";
  if (!path.starts_with(prefix)) return std::nullopt;
  return parse_number<unsigned>(path.substr(prefix.size()));
}

namespace {

// A rule field that is absent, null or -1 is a wildcard (OCI runtime spec, config-linux.md).
std::optional<long> rule_number(const Json& rule, const char* key) {
  auto it = rule.find(key);
  if (it == rule.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return std::nullopt;
  long v = it->get<long>();
  if (v < 0) return std::nullopt;
  return v;
}

std::string rule_type(const Json& rule) {
  auto it = rule.find("type");
  if (it == rule.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) return "a";
  return it->get<std::string>();
}

bool rule_allows(const Json& rule) {
  return rule.value("allow", false);
}

bool grants_read_or_write(const Json& rule) {
  std::string access = rule.value("access", "rwm");
  return access.find_first_of("rw") != std::string::npos;
}

// Any "a" rule (type "a", empty or absent) resets the whole list to allow-all or deny-all,
// whatever its major, minor and access say: runc 1.1's devices emulator, measured with runc 1.1.5
// (an allow "a 1:3 m" after a deny-all opens every GPU for read and write; docs/fuzzing.md).
// Found by tests/fuzz/fuzz_oci_spec.cpp: with numbers, such a rule was taken for a narrow one.
bool is_everything(const Json& rule) {
  return rule_type(rule) == "a";
}

bool covers_char_major(const Json& rule, unsigned major) {
  std::string type = rule_type(rule);
  if (type != "a" && type != "c") return false;
  auto m = rule_number(rule, "major");
  return !m || *m == static_cast<long>(major);
}

std::string describe_rule(const Json& rule) {
  auto num = [&](const char* k) {
    auto v = rule_number(rule, k);
    return v ? std::to_string(*v) : std::string("*");
  };
  return cat(rule_allows(rule) ? "allow " : "deny ", rule_type(rule), " ", num("major"), ":",
             num("minor"), " ", rule.value("access", "rwm"));
}

Json device_entry(const DeviceNode& node) {
  Json d = Json::object();
  d["path"] = node.path;
  d["type"] = "c";
  d["major"] = node.major;
  d["minor"] = node.minor;
  d["fileMode"] = 0666;
  d["uid"] = 0;
  d["gid"] = 0;
  return d;
}

Json cgroup_rule(bool allow, unsigned major, unsigned minor) {
  Json r = Json::object();
  r["allow"] = allow;
  r["type"] = "c";
  r["major"] = major;
  r["minor"] = minor;
  r["access"] = "rwm";
  return r;
}

// Fields the edit reads with a default must have their OCI type where present: nlohmann's
// value() throws on a mismatch, and the shim must refuse such a spec naming the field (runc
// refuses it too) instead of dying on an exception. Found by tests/fuzz/fuzz_oci_spec.cpp.
Status check_member_types(const Json& spec) {
  auto linux_node = spec.find("linux");
  if (linux_node == spec.end() || !linux_node->is_object()) return {};
  auto not_of_type = [](const Json& obj, const char* key, Json::value_t type) {
    auto it = obj.find(key);
    return obj.is_object() && it != obj.end() && it->type() != type;
  };
  if (auto devices = linux_node->find("devices");
      devices != linux_node->end() && devices->is_array()) {
    for (size_t i = 0; i < devices->size(); ++i) {
      if (not_of_type((*devices)[i], "path", Json::value_t::string))
        return fail(Errc::parse, "linux.devices[", i, "].path is not a string");
    }
  }
  auto resources = linux_node->find("resources");
  if (resources == linux_node->end() || !resources->is_object()) return {};
  auto rules = resources->find("devices");
  if (rules == resources->end() || !rules->is_array()) return {};
  for (size_t i = 0; i < rules->size(); ++i) {
    if (not_of_type((*rules)[i], "allow", Json::value_t::boolean))
      return fail(Errc::parse, "linux.resources.devices[", i, "].allow is not a boolean");
    if (not_of_type((*rules)[i], "access", Json::value_t::string))
      return fail(Errc::parse, "linux.resources.devices[", i, "].access is not a string");
  }
  return {};
}

}  // namespace

Result<IsolationResult> isolate_spec(Json& spec, const IsolationPlan& plan) {
  if (auto st = check_member_types(spec); !st) return std::unexpected(st.error());
  IsolationResult result;
  std::set<std::string> grant_paths;
  std::set<std::pair<unsigned, unsigned>> grant_numbers;
  for (const auto& n : plan.grant) {
    grant_paths.insert(n.path);
    grant_numbers.emplace(n.major, n.minor);
  }
  auto is_denied_gpu = [&](unsigned major, unsigned minor) {
    return major == kNvidiaMajor && plan.deny_minors.contains(minor);
  };

  // 1. linux.devices: drop every GPU node, and any stale entry for a node we grant, then add
  //    the granted nodes. A privileged container arrives with every host device listed here.
  bool had_linux = spec.contains("linux");
  Json& linux_node = ensure_object(spec, "linux");
  bool had_resources = linux_node.contains("resources");
  bool had_devices = linux_node.contains("devices");
  Json& devices = ensure_array(linux_node, "devices");
  Json kept = Json::array();
  for (const auto& d : devices) {
    std::string path = d.is_object() ? d.value("path", "") : "";
    if (gpu_node_minor(path) || grant_paths.contains(path)) {
      if (gpu_node_minor(path) && !grant_paths.contains(path)) result.removed_nodes.push_back(path);
      continue;
    }
    kept.push_back(d);
  }
  for (const auto& n : plan.grant) kept.push_back(device_entry(n));
  if (kept != devices) result.changed = true;
  devices = std::move(kept);
  if (!had_devices && devices.empty()) linux_node.erase("devices");

  // 2. The devices cgroup. Replay the rules to learn the final default: the last "a *:*" rule
  //    decides whether the spec is allow-all (privileged) or default-deny.
  Json& resources = ensure_object(linux_node, "resources");
  bool had_rules = resources.contains("devices");
  Json& rules = ensure_array(resources, "devices");
  bool allow_all = false;
  for (const auto& r : rules) {
    if (r.is_object() && is_everything(r)) allow_all = rule_allows(r);
  }

  Json new_rules = Json::array();
  for (const auto& r : rules) {
    if (!r.is_object() || !rule_allows(r) || is_everything(r) ||
        !covers_char_major(r, kNvidiaMajor)) {
      new_rules.push_back(r);
      continue;
    }
    auto major = rule_number(r, "major");
    auto minor = rule_number(r, "minor");
    if (major && minor) {
      // A specific node: drop it if it is an unallocated GPU.
      if (is_denied_gpu(static_cast<unsigned>(*major), static_cast<unsigned>(*minor))) {
        ++result.removed_rules;
        continue;
      }
      new_rules.push_back(r);
      continue;
    }
    if (!grants_read_or_write(r)) {  // "c *:* m": mknod alone opens nothing
      new_rules.push_back(r);
      continue;
    }
    if (major && !minor) {
      // "c 195:* rw" admits every GPU: replace it by explicit allows for what we grant.
      ++result.removed_rules;
      continue;
    }
    if (!allow_all && !plan.deny_minors.empty()) {
      return fail(Errc::denied, "cgroup rule '", describe_rule(r),
                  "' admits every character device including unallocated GPUs, and runc cannot "
                  "deny inside a wildcard allow");
    }
    new_rules.push_back(r);
  }
  for (const auto& n : plan.grant) {
    Json allow = cgroup_rule(true, n.major, n.minor);
    if (std::find(new_rules.begin(), new_rules.end(), allow) == new_rules.end())
      new_rules.push_back(allow);
  }
  if (allow_all) {
    // Denies go last so nothing after them re-opens a GPU.
    for (unsigned minor : plan.deny_minors) {
      if (grant_numbers.contains({kNvidiaMajor, minor})) continue;
      new_rules.push_back(cgroup_rule(false, kNvidiaMajor, minor));
      result.denied_minors.push_back(minor);
    }
  }
  if (new_rules != rules) result.changed = true;
  rules = std::move(new_rules);
  if (!had_rules && rules.empty()) resources.erase("devices");
  if (!had_resources && resources.empty()) linux_node.erase("resources");
  if (!had_linux && linux_node.empty()) spec.erase("linux");

  // 3. The environment: name the granted GPUs by UUID so nothing downstream re-expands "all",
  //    and CUDA uses the right GPU even where it could see more (the seed's GPU-0 symptom).
  auto nvd = get_env(spec, "NVIDIA_VISIBLE_DEVICES");
  auto cvd = get_env(spec, "CUDA_VISIBLE_DEVICES");
  if (!plan.uuids.empty()) {
    std::string list = join(plan.uuids, ",");
    if (nvd != list) set_env(spec, "NVIDIA_VISIBLE_DEVICES", list), result.changed = true;
    if (cvd != list) set_env(spec, "CUDA_VISIBLE_DEVICES", list), result.changed = true;
  } else {
    std::string none = plan.explicit_none ? "none" : "void";
    if (nvd && *nvd != none) set_env(spec, "NVIDIA_VISIBLE_DEVICES", none), result.changed = true;
    if (cvd && !cvd->empty()) set_env(spec, "CUDA_VISIBLE_DEVICES", ""), result.changed = true;
  }
  return result;
}

}  // namespace gpufence
