// Where gpufence enforces a GPU pod's allocation on a node (docs/install.md, "Enforcement"):
//   runtime  the `nvidia` RuntimeClass handler runs gpufence-runtime (the shim) — every
//            containerd line, but only pods that name the handler;
//   nri      gpufence-nri inside containerd's CreateContainer — every container, no handler;
//            fail closed through `required_plugins` from containerd 2.2 (NRI API v0.10);
//   both     the two: on containerd < 2.2 the shim keeps privileged GPU pods narrowed, which
//            NRI cannot do there (docs/nri.md, "What can be enforced").
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace gpufence {

enum class Enforcement { runtime, nri, both };
enum class EnforcementRequest { automatic, runtime, nri, both };

std::string_view enforcement_name(Enforcement e);
Result<Enforcement> parse_enforcement(std::string_view name);
Result<EnforcementRequest> parse_enforcement_request(std::string_view name);  // + "auto"

constexpr bool uses_handler(Enforcement e) {
  return e != Enforcement::nri;
}
constexpr bool uses_nri(Enforcement e) {
  return e != Enforcement::runtime;
}

// The NRI API minor version (v0.<minor>) a containerd release speaks, as
// nri@v0.12.0:pkg/api/version.go `InferVersionFromRuntime` maps it: 1.7.14-1.7.25 -> 6,
// 1.7.26+/2.0/2.1 -> 8, 2.2.0 -> 10, 2.2.1+ -> 11, 2.3+ -> 12. nullopt: no NRI (1.6, 1.7.0-13)
// or a release that does not parse.
std::optional<int> nri_api_minor(std::string_view release);

// Since v0.10 (containerd 2.2.0): device cgroup rules from plugins, and default_validator's
// required_plugins.
inline constexpr int kNriFailClosedMinor = 10;

struct EnforcementChoice {
  Enforcement mode = Enforcement::runtime;
  bool required_plugins = false;  // the release has default_validator: fail closed
  std::string reason;             // one line for the report
};

// The mode for a request on a node whose running containerd is `release` (nullopt: it did not
// answer CRI Version). `template_config`: k3s/rke2 render their config from a template, and
// k0s generates its own, which gpufence does not edit for NRI. Explicit requests the node cannot
// carry are refused.
Result<EnforcementChoice> choose_enforcement(EnforcementRequest request,
                                             const std::optional<std::string>& release,
                                             bool template_config);

}  // namespace gpufence
