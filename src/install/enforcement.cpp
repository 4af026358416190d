#include "install/enforcement.hpp"

#include "common/strings.hpp"

namespace gpufence {
namespace {

struct Release {
  int major = 0, minor = 0, patch = 0;
};

// "v2.3.4", "1.7.24~ds1", "v2.0.4-k3s2": the leading numbers.
std::optional<Release> parse_release(std::string_view text) {
  text = trim(text);
  if (text.starts_with("v")) text.remove_prefix(1);
  int parts[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    size_t end = 0;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    auto n = parse_number<int>(text.substr(0, end));
    if (!n) {
      if (i < 2) return std::nullopt;  // major and minor are required
      break;
    }
    parts[i] = *n;
    text.remove_prefix(end);
    if (!text.starts_with(".")) break;
    text.remove_prefix(1);
  }
  return Release{parts[0], parts[1], parts[2]};
}

}  // namespace

std::string_view enforcement_name(Enforcement e) {
  switch (e) {
    case Enforcement::runtime:
      return "runtime";
    case Enforcement::nri:
      return "nri";
    case Enforcement::both:
      return "both";
  }
  return "runtime";
}

Result<Enforcement> parse_enforcement(std::string_view name) {
  if (name == "runtime") return Enforcement::runtime;
  if (name == "nri") return Enforcement::nri;
  if (name == "both") return Enforcement::both;
  return fail(Errc::invalid_argument, "enforcement '", name, "' (runtime, nri, both)");
}

Result<EnforcementRequest> parse_enforcement_request(std::string_view name) {
  if (name == "auto") return EnforcementRequest::automatic;
  auto e = parse_enforcement(name);
  if (!e)
    return fail(Errc::invalid_argument, "--enforcement: '", name, "' (auto, nri, runtime, both)");
  switch (*e) {
    case Enforcement::runtime:
      return EnforcementRequest::runtime;
    case Enforcement::nri:
      return EnforcementRequest::nri;
    case Enforcement::both:
      return EnforcementRequest::both;
  }
  return EnforcementRequest::runtime;
}

std::optional<int> nri_api_minor(std::string_view release) {
  auto r = parse_release(release);
  if (!r) return std::nullopt;
  if (r->major < 1 || (r->major == 1 && r->minor < 7)) return std::nullopt;
  if (r->major == 1 && r->minor == 7) {
    if (r->patch < 14) return std::nullopt;
    return r->patch <= 25 ? 6 : 8;
  }
  if (r->major == 1) return 8;  // no 1.8 was released; read as the 1.7.26+ line
  if (r->major == 2 && r->minor <= 1) return 8;
  if (r->major == 2 && r->minor == 2) return r->patch == 0 ? 10 : 11;
  return 12;
}

Result<EnforcementChoice> choose_enforcement(EnforcementRequest request,
                                             const std::optional<std::string>& release,
                                             bool template_config) {
  // -1: no NRI, or an unknown release.
  const int api = release ? nri_api_minor(*release).value_or(-1) : -1;
  const std::string who = release ? cat("containerd ", *release) : std::string("containerd");
  const std::string api_text = api >= 0 ? cat("NRI v0.", api) : std::string("no NRI");
  EnforcementChoice c;
  c.required_plugins = api >= kNriFailClosedMinor;

  if (request == EnforcementRequest::runtime) {
    c.mode = Enforcement::runtime;
    c.required_plugins = false;
    c.reason = "runtime (asked for): GPU pods name the RuntimeClass handler";
    return c;
  }
  if (request == EnforcementRequest::automatic) {
    if (template_config) {
      c.mode = Enforcement::runtime;
      c.required_plugins = false;
      c.reason =
          "runtime: k3s/rke2 render containerd's config from a template, and k0s generates "
          "its own, which gpufence does not edit for NRI";
    } else if (!release) {
      c.mode = Enforcement::runtime;
      c.required_plugins = false;
      c.reason =
          "runtime: the running containerd did not answer CRI Version, so whether it has "
          "NRI v0.10 (containerd >= 2.2) is unknown";
    } else if (api < 0) {
      c.mode = Enforcement::runtime;
      c.reason = cat("runtime: ", who, " has no NRI (containerd 1.7.14 and later have it)");
    } else if (c.required_plugins) {
      c.mode = Enforcement::nri;
      c.reason = cat("nri: ", who, " has ", api_text,
                     " (>= v0.10): gpufence-nri narrows every container, privileged ones "
                     "included, and required_plugins with its fence (gpufence-fence) fail "
                     "creates while it is down, stalled or late");
    } else {
      c.mode = Enforcement::runtime;
      c.reason = cat("runtime: ", who, " has ", api_text,
                     " (< v0.10, containerd < 2.2): NRI cannot narrow privileged containers nor "
                     "fail closed there (--enforcement both adds gpufence-nri for pods without "
                     "the handler)");
    }
    return c;
  }
  // nri or both, asked for.
  const Enforcement mode =
      request == EnforcementRequest::nri ? Enforcement::nri : Enforcement::both;
  const std::string_view name = enforcement_name(mode);
  if (template_config)
    return fail(Errc::unsupported, "--enforcement ", name,
                ": k3s/rke2 render containerd's config from a template, and k0s generates its "
                "own, which gpufence does not edit for NRI; use --enforcement runtime");
  if (!release)
    return fail(Errc::unsupported, "--enforcement ", name,
                ": the running containerd did not answer CRI Version, so which NRI it has "
                "(and whether required_plugins exists) is unknown; start containerd first");
  if (api < 0)
    return fail(Errc::unsupported, "--enforcement ", name, ": ", who,
                " has no NRI (containerd 1.7.14 or later); use --enforcement runtime");
  c.mode = mode;
  if (c.required_plugins) {
    c.reason = cat(name, " (asked for): ", who, " has ", api_text,
                   ": required_plugins with the fence (gpufence-fence) fail creates while "
                   "gpufence-nri is down, stalled or late");
  } else {
    c.reason = cat(name, " (asked for): ", who, " has ", api_text,
                   " (< v0.10): NRI enforcement is not guaranteed while gpufence-nri is down, and "
                   "privileged containers are not narrowed through NRI",
                   mode == Enforcement::both ? " (the handler keeps them narrowed)"
                                             : "; --enforcement both pairs it with the shim");
  }
  return c;
}

}  // namespace gpufence
