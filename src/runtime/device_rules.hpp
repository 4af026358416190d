// The one interpretation of OCI device cgroup rules (linux.resources.devices), shared by the shim
// (which rewrites them) and the doctor (which judges running containers by them).
//
// Meaning (OCI runtime spec, config-linux.md "Allowed Device List"; runc libcontainer/devices):
// - type "a" (or absent/empty) covers both "c" and "b" — and runc 1.1 takes any "a" rule as all
//   devices with all access, ignoring its numbers and access, so that is how it is read here;
// - an absent, null or negative major/minor is a wildcard;
// - access is a subset of "rwm" (absent = "rwm");
// - the list is applied in order over a default of "deny everything": for each access bit the last
//   rule that covers the device decides.
// See docs/device-cgroup.md for how runc's two cgroup drivers express these rules.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "runtime/oci_spec.hpp"

namespace gpufence {

struct DeviceRule {
  bool allow = false;
  char type = 'a';                // 'a', 'c' or 'b'
  std::optional<unsigned> major;  // nullopt = wildcard
  std::optional<unsigned> minor;  // nullopt = wildcard
  std::string access = "rwm";

  bool operator==(const DeviceRule&) const = default;
};

// Reads one rule; `where` names it in errors ("linux.resources.devices[3]").
Result<DeviceRule> parse_device_rule(const Json& rule, std::string_view where);
// Reads linux.resources.devices of a spec (absent = empty list).
Result<std::vector<DeviceRule>> parse_spec_device_rules(const Json& spec);
Json device_rule_json(const DeviceRule& rule);
// "allow c 195:* rw"
std::string describe_device_rule(const DeviceRule& rule);

// Whether `rule` applies to a device of `type` with these numbers. A nullopt minor stands for
// "a minor no rule names": only wildcard-minor rules apply to it; likewise for a nullopt major.
bool rule_covers(const DeviceRule& rule, char type, std::optional<unsigned> major,
                 std::optional<unsigned> minor);

// The access bits ("rwm" subset, in that order) the rules leave for such a device.
std::string effective_access(const std::vector<DeviceRule>& rules, char type,
                             std::optional<unsigned> major, std::optional<unsigned> minor);

// Whether a process may open (read or write) char device major:minor under the rules.
bool rules_allow_open(const std::vector<DeviceRule>& rules, unsigned major, unsigned minor);

}  // namespace gpufence
