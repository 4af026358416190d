#include "runtime/device_rules.hpp"

namespace gpufence {
namespace {

Result<std::optional<unsigned>> rule_number(const Json& rule, const char* key,
                                            std::string_view where) {
  auto it = rule.find(key);
  if (it == rule.end() || it->is_null()) return std::optional<unsigned>();
  if (!it->is_number_integer())
    return fail(Errc::parse, where, ".", key, " must be an integer or null");
  long long v = it->get<long long>();
  if (v < 0) return std::optional<unsigned>();  // -1: runc's Wildcard
  if (v > 0xFFFFFFFFLL) return fail(Errc::parse, where, ".", key, " is out of range");
  return std::optional<unsigned>(static_cast<unsigned>(v));
}

}  // namespace

Result<DeviceRule> parse_device_rule(const Json& rule, std::string_view where) {
  if (!rule.is_object()) return fail(Errc::parse, where, " must be an object");
  DeviceRule r;
  if (auto it = rule.find("allow"); it != rule.end()) {
    if (!it->is_boolean()) return fail(Errc::parse, where, ".allow must be a boolean");
    r.allow = it->get<bool>();
  } else {
    return fail(Errc::parse, where, ".allow is required");
  }
  if (auto it = rule.find("type"); it != rule.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Errc::parse, where, ".type must be a string");
    const auto& t = it->get_ref<const std::string&>();
    if (t.empty() || t == "a")
      r.type = 'a';
    else if (t == "c" || t == "b")
      r.type = t[0];
    else
      return fail(Errc::parse, where, ".type '", t, "' is not a, b or c");
  }
  auto major = rule_number(rule, "major", where);
  if (!major) return std::unexpected(major.error());
  auto minor = rule_number(rule, "minor", where);
  if (!minor) return std::unexpected(minor.error());
  r.major = *major;
  r.minor = *minor;
  if (auto it = rule.find("access"); it != rule.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Errc::parse, where, ".access must be a string");
    r.access = it->get<std::string>();
    if (r.access.find_first_not_of("rwm") != std::string::npos)
      return fail(Errc::parse, where, ".access '", r.access, "' is not a subset of rwm");
  }
  // runc 1.1 (its devices emulator, and the kernel's v1 "a" entry) takes every type-"a" rule as
  // all devices, all access, whatever numbers and access it names: "allow a 1:3 m" after a
  // deny-all opens every GPU (measured, docs/device-cgroup.md). Read it the way runc runs it.
  if (r.type == 'a') {
    r.major.reset();
    r.minor.reset();
    r.access = "rwm";
  }
  return r;
}

Result<std::vector<DeviceRule>> parse_spec_device_rules(const Json& spec) {
  std::vector<DeviceRule> out;
  const Json* node = &spec;
  for (const char* key : {"linux", "resources", "devices"}) {
    if (!node->is_object()) return out;
    auto it = node->find(key);
    if (it == node->end() || it->is_null()) return out;
    node = &*it;
  }
  if (!node->is_array()) return fail(Errc::parse, "linux.resources.devices must be an array");
  for (size_t i = 0; i < node->size(); ++i) {
    auto r = parse_device_rule((*node)[i], cat("linux.resources.devices[", i, "]"));
    if (!r) return std::unexpected(r.error());
    out.push_back(*r);
  }
  return out;
}

Json device_rule_json(const DeviceRule& rule) {
  Json r = Json::object();
  r["allow"] = rule.allow;
  r["type"] = std::string(1, rule.type);
  if (rule.major) r["major"] = *rule.major;
  if (rule.minor) r["minor"] = *rule.minor;
  r["access"] = rule.access;
  return r;
}

std::string describe_device_rule(const DeviceRule& rule) {
  auto num = [](const std::optional<unsigned>& v) {
    return v ? std::to_string(*v) : std::string("*");
  };
  return cat(rule.allow ? "allow " : "deny ", rule.type, " ", num(rule.major), ":", num(rule.minor),
             " ", rule.access);
}

bool rule_covers(const DeviceRule& rule, char type, std::optional<unsigned> major,
                 std::optional<unsigned> minor) {
  if (rule.type != 'a' && rule.type != type) return false;
  if (rule.major && (!major || *rule.major != *major)) return false;
  if (rule.minor && (!minor || *rule.minor != *minor)) return false;
  return true;
}

std::string effective_access(const std::vector<DeviceRule>& rules, char type,
                             std::optional<unsigned> major, std::optional<unsigned> minor) {
  bool bits[3] = {false, false, false};
  const char names[3] = {'r', 'w', 'm'};
  for (const auto& r : rules) {
    if (!rule_covers(r, type, major, minor)) continue;
    for (int b = 0; b < 3; ++b) {
      if (r.access.find(names[b]) != std::string::npos) bits[b] = r.allow;
    }
  }
  std::string out;
  for (int b = 0; b < 3; ++b)
    if (bits[b]) out += names[b];
  return out;
}

bool rules_allow_open(const std::vector<DeviceRule>& rules, unsigned major, unsigned minor) {
  return effective_access(rules, 'c', major, minor).find_first_of("rw") != std::string::npos;
}

}  // namespace gpufence
