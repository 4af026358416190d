#include "runtime/isolation.hpp"

#include <algorithm>
#include <map>

#include "common/strings.hpp"
#include "runtime/device_rules.hpp"

namespace gpufence {

std::optional<unsigned> gpu_node_minor(std::string_view path) {
  constexpr std::string_view prefix = "/dev/nvidia";
  if (!path.starts_with(prefix)) return std::nullopt;
  return parse_number<unsigned>(path.substr(prefix.size()));
}

namespace {

struct SpecNode {
  char type = 0;
  unsigned major = 0;
  unsigned minor = 0;
};

// A linux.devices entry's numbers (types were checked by check_spec_fields).
std::optional<SpecNode> spec_node(const Json& d) {
  if (!d.is_object()) return std::nullopt;
  std::string type = d.value("type", "");
  if ((type != "c" && type != "u" && type != "b") || !d.contains("major") || !d.contains("minor"))
    return std::nullopt;
  return SpecNode{type == "b" ? 'b' : 'c', d["major"].get<unsigned>(), d["minor"].get<unsigned>()};
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

DeviceRule allow_rule(char type, std::optional<unsigned> major, std::optional<unsigned> minor,
                      std::string access) {
  return DeviceRule{true, type, major, minor, std::move(access)};
}

bool has_rw(std::string_view access) {
  return access.find_first_of("rw") != std::string_view::npos;
}

// Access bits of `access` beyond those of `base`.
bool adds_bits(std::string_view access, std::string_view base) {
  return std::any_of(access.begin(), access.end(),
                     [&](char c) { return base.find(c) == std::string_view::npos; });
}

// 1. linux.devices: drop every GPU node not granted and every reserved-major node not granted or
//    kept, then add the granted nodes. A privileged container arrives with every host device here.
void edit_device_list(Json& spec, const IsolationPlan& plan, IsolationResult& result,
                      std::vector<SpecNode>& remaining) {
  std::set<std::string> grant_paths;
  std::set<DeviceNumber> allowed_numbers = plan.keep;
  for (const auto& n : plan.grant) {
    grant_paths.insert(n.path);
    allowed_numbers.emplace(n.major, n.minor);
  }
  bool had_linux = spec.contains("linux");
  Json& linux_node = ensure_object(spec, "linux");
  bool had_devices = linux_node.contains("devices");
  Json& devices = ensure_array(linux_node, "devices");
  Json kept = Json::array();
  for (const auto& d : devices) {
    std::string path = d.is_object() ? d.value("path", "") : "";
    auto node = spec_node(d);
    bool reserved = node && node->type == 'c' && plan.reserved_majors.contains(node->major) &&
                    !allowed_numbers.contains({node->major, node->minor});
    bool stray_gpu = gpu_node_minor(path) && !grant_paths.contains(path);
    if (grant_paths.contains(path)) continue;  // re-added below, with the host's numbers
    if (reserved || stray_gpu) {
      result.removed_nodes.push_back(path);
      continue;
    }
    if (node) remaining.push_back(*node);
    kept.push_back(d);
  }
  for (const auto& n : plan.grant) {
    kept.push_back(device_entry(n));
    remaining.push_back({'c', n.major, n.minor});
  }
  if (kept != devices) result.changed = true;
  devices = std::move(kept);
  if (!had_devices && devices.empty()) linux_node.erase("devices");
  if (!had_linux && linux_node.empty()) spec.erase("linux");
}

// 2a. A list that admits by wildcard major, rewritten as a whitelist with the same meaning for
//     every registered major, minus the reserved ones, which get only their granted/kept nodes.
std::vector<DeviceRule> whitelist_rules(const std::vector<DeviceRule>& rules,
                                        const IsolationPlan& plan,
                                        const std::vector<SpecNode>& nodes) {
  std::vector<DeviceRule> out = {DeviceRule{false, 'a', std::nullopt, std::nullopt, "rwm"}};
  for (char type : {'c', 'b'}) {
    if (effective_access(rules, type, std::nullopt, std::nullopt).find('m') != std::string::npos)
      out.push_back(allow_rule(type, std::nullopt, std::nullopt, "m"));
  }
  for (char type : {'c', 'b'}) {
    std::set<unsigned> majors(
        type == 'c' ? plan.host_majors.character.begin() : plan.host_majors.block.begin(),
        type == 'c' ? plan.host_majors.character.end() : plan.host_majors.block.end());
    for (const auto& r : rules)
      if (r.major && (r.type == 'a' || r.type == type)) majors.insert(*r.major);
    for (const auto& n : nodes)
      if (n.type == type) majors.insert(n.major);
    for (unsigned major : majors) {
      if (type == 'c' && plan.reserved_majors.contains(major)) continue;
      std::set<unsigned> minors;  // every minor a rule or a listed node names
      for (const auto& r : rules)
        if (r.major && *r.major == major && r.minor && (r.type == 'a' || r.type == type))
          minors.insert(*r.minor);
      for (const auto& n : nodes)
        if (n.type == type && n.major == major) minors.insert(n.minor);
      std::string generic = effective_access(rules, type, major, std::nullopt);
      bool hole = std::any_of(minors.begin(), minors.end(), [&](unsigned m) {
        return adds_bits(generic, effective_access(rules, type, major, m));
      });
      if (has_rw(generic) && !hole) {
        out.push_back(allow_rule(type, major, std::nullopt, generic));
        for (unsigned m : minors) {
          std::string a = effective_access(rules, type, major, m);
          if (adds_bits(a, generic)) out.push_back(allow_rule(type, major, m, a));
        }
        continue;
      }
      // No wildcard can say it: allow node by node what the spec lists and the rules admit.
      for (unsigned m : minors) {
        std::string a = effective_access(rules, type, major, m);
        if (has_rw(a)) out.push_back(allow_rule(type, major, m, a));
      }
    }
  }
  for (const auto& n : nodes) {
    if (n.type != 'c' || !plan.reserved_majors.contains(n.major)) continue;
    bool granted = std::any_of(plan.grant.begin(), plan.grant.end(), [&](const DeviceNode& g) {
      return g.major == n.major && g.minor == n.minor;
    });
    std::string a = granted ? "rwm" : effective_access(rules, 'c', n.major, n.minor);
    if (has_rw(a)) out.push_back(allow_rule('c', n.major, n.minor, a));
  }
  return out;
}

// 2b. A default-deny list edited in place: allows of reserved majors that are not for a granted
//     or kept node go; then the granted (and listed kept) nodes are allowed.
std::vector<DeviceRule> narrowed_rules(const std::vector<DeviceRule>& rules,
                                       const IsolationPlan& plan,
                                       const std::vector<SpecNode>& nodes,
                                       IsolationResult& result) {
  std::set<DeviceNumber> allowed = plan.keep;
  for (const auto& n : plan.grant) allowed.emplace(n.major, n.minor);
  std::vector<DeviceRule> out;
  for (const auto& r : rules) {
    bool reserved_allow = r.allow && (r.type == 'a' || r.type == 'c') && r.major &&
                          plan.reserved_majors.contains(*r.major) &&
                          !(r.minor && allowed.contains({*r.major, *r.minor}));
    if (reserved_allow) {
      ++result.removed_rules;
      continue;
    }
    out.push_back(r);
  }
  auto ensure_allowed = [&](unsigned major, unsigned minor) {
    if (rules_allow_open(out, major, minor) &&
        effective_access(out, 'c', major, minor).find('m') != std::string::npos)
      return;
    out.push_back(allow_rule('c', major, minor, "rwm"));
  };
  for (const auto& n : plan.grant) ensure_allowed(n.major, n.minor);
  for (const auto& n : nodes) {
    // A kept node that only a dropped wildcard (e.g. "c 226:* rw") admitted.
    if (n.type == 'c' && plan.keep.contains({n.major, n.minor}) &&
        !rules_allow_open(out, n.major, n.minor) && rules_allow_open(rules, n.major, n.minor))
      out.push_back(
          allow_rule('c', n.major, n.minor, effective_access(rules, 'c', n.major, n.minor)));
  }
  return out;
}

void edit_device_rules(Json& spec, const std::vector<DeviceRule>& rules, const IsolationPlan& plan,
                       const std::vector<SpecNode>& nodes, IsolationResult& result) {
  bool wildcard = std::any_of(rules.begin(), rules.end(), [](const DeviceRule& r) {
    return r.allow && !r.major && has_rw(r.access);
  });
  std::vector<DeviceRule> out =
      wildcard ? whitelist_rules(rules, plan, nodes) : narrowed_rules(rules, plan, nodes, result);
  result.whitelisted = wildcard;
  if (out == rules) return;
  Json list = Json::array();
  for (const auto& r : out) list.push_back(device_rule_json(r));
  ensure_array(ensure_object(ensure_object(spec, "linux"), "resources"), "devices") =
      std::move(list);
  result.changed = true;
}

// 3. The cgroup filesystem read-only: a privileged container could otherwise write its own
//    devices.allow. (It can still remount it with CAP_SYS_ADMIN: not a boundary, a tripwire.)
void cgroupfs_read_only(Json& spec, IsolationResult& result) {
  auto mounts = spec.find("mounts");
  if (mounts == spec.end() || !mounts->is_array()) return;
  for (auto& m : *mounts) {
    if (!m.is_object()) continue;
    std::string type = m.value("type", "");
    if (m.value("destination", "") != "/sys/fs/cgroup" && type != "cgroup" && type != "cgroup2")
      continue;
    Json& options = ensure_array(m, "options");
    Json out = Json::array();
    bool ro = false;
    for (const auto& o : options) {
      if (o == "rw") continue;
      ro |= o == "ro";
      out.push_back(o);
    }
    if (!ro) out.push_back("ro");
    if (out != options) {
      options = std::move(out);
      result.changed = true;
    }
  }
}

// 4. The environment: name the granted GPUs by UUID so nothing downstream re-expands "all", and
//    CUDA uses the right GPU even where it could see more (the seed's GPU-0 symptom).
void edit_env(Json& spec, const IsolationPlan& plan, IsolationResult& result) {
  auto nvd = get_env(spec, "NVIDIA_VISIBLE_DEVICES");
  auto cvd = get_env(spec, "CUDA_VISIBLE_DEVICES");
  if (!plan.uuids.empty()) {
    std::string list = join(plan.uuids, ",");
    if (nvd != list) set_env(spec, "NVIDIA_VISIBLE_DEVICES", list), result.changed = true;
    if (cvd != list) set_env(spec, "CUDA_VISIBLE_DEVICES", list), result.changed = true;
    return;
  }
  std::string none = plan.explicit_none ? "none" : "void";
  if (nvd && *nvd != none) set_env(spec, "NVIDIA_VISIBLE_DEVICES", none), result.changed = true;
  if (cvd && !cvd->empty()) set_env(spec, "CUDA_VISIBLE_DEVICES", ""), result.changed = true;
}

}  // namespace

bool admits_all_devices(const Json& spec) {
  auto rules = parse_spec_device_rules(spec);
  if (!rules) return false;
  return std::any_of(rules->begin(), rules->end(),
                     [](const DeviceRule& r) { return r.allow && !r.major && has_rw(r.access); });
}

Result<IsolationResult> isolate_spec(Json& spec, const IsolationPlan& plan) {
  IsolationResult result;
  // Every field read below has the type the steps assume; nothing is edited otherwise.
  if (auto st = check_spec_fields(spec); !st) return std::unexpected(st.error());
  auto rules = parse_spec_device_rules(spec);
  if (!rules) return std::unexpected(rules.error());
  std::vector<SpecNode> nodes;
  edit_device_list(spec, plan, result, nodes);
  edit_device_rules(spec, *rules, plan, nodes, result);
  cgroupfs_read_only(spec, result);
  edit_env(spec, plan, result);
  return result;
}

}  // namespace gpufence
