// k0s: one drop-in of gpufence's own in /etc/k0s/containerd.d (containerd/setup_parts.hpp).
#include "containerd/setup_parts.hpp"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include "common/file.hpp"
#include "common/go_match.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "containerd/toml_text.hpp"
#include "containerd/versions.hpp"

namespace gpufence::setup_parts {

// ---- k0s: one drop-in of gpufence's own in /etc/k0s/containerd.d ----

// k0s regenerates containerd.toml, and so applies containerd.d, only while its first line is this
// (isK0sManagedConfig, k0s pkg/component/worker/containerd/component.go; k0s before 1.30 wrote a
// blank line first, which it skips).
constexpr std::string_view kK0sManaged = "# k0s_managed=true";

bool k0s_managed(std::string_view text) {
  for (std::string_view line : split(text, '\n')) {
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.empty()) continue;
    return line == kK0sManaged;
  }
  return false;
}

// The runtimes the handler inherits from: containerd.toml with the imports it names by path
// (k0s with containerd 1.x: /run/k0s/containerd-cri.toml, the CRI config k0s generated, runc
// included). Globs are not expanded (containerd.d itself, gpufence's earlier drop-in among
// them); an import that cannot be read leaves the root file alone.
ContainerdConfig k0s_base_config(const ContainerdConfig& root, const ReadFile& read) {
  auto merged = merge_imports(
      root,
      [&](const std::string& p) -> Result<std::string> {
        auto text = read(p);
        if (!text) return std::unexpected(text.error());
        if (!text->has_value()) return fail(Errc::not_found, p, " does not exist");
        return **text;
      },
      [](const std::string& pattern) {
        if (pattern.find_first_of("*?[\\") != std::string::npos) return std::vector<std::string>{};
        return std::vector<std::string>{pattern};
      });
  return merged ? *merged : root;
}

// k0s's containerd reads the handler from a drop-in in containerd.d that k0s loads beside the
// containerd.toml it writes itself: that file is read (its version and whether k0s manages it)
// and never written. The drop-in takes containerd.toml's version: 2 on k0s with containerd 1.x
// (a drop-in holding plugins."io.containerd.grpc.v1.cri" is merged into k0s's CRI config,
// configurer.go handleImports), 3 on k0s 1.36+ (containerd 2.2 imports containerd.d/*.toml and
// merges it; k0s refuses a drop-in of another version, k0sproject/k0s#7689). docs/install.md,
// "Distributions".
Result<SetupPlan> plan_k0s(const SetupOptions& opt, const ReadFile& read) {
  const DistributionRow& row = distribution_row(Distribution::k0s);
  if (opt.nri.enable || opt.handler == HandlerEdit::skip)
    return fail(Errc::unsupported,
                "NRI enforcement is not configured on k0s by gpufence (k0s generates its "
                "containerd config itself): use --enforcement runtime there");
  const std::string root_path(row.config_read);
  const std::filesystem::path default_drop_in(row.config_input);
  const std::string dir = default_drop_in.parent_path().string();
  const std::string drop_in = !opt.drop_in_path.empty()  ? opt.drop_in_path
                              : !opt.config_path.empty() ? opt.config_path
                                                         : default_drop_in.string();
  // k0s loads <dir>/*.toml and nothing else: a drop-in elsewhere would never be read.
  const std::filesystem::path p(drop_in);
  if (p.parent_path() != dir || p.extension() != ".toml" || p.stem().empty())
    return fail(Errc::invalid_argument, drop_in, ": k0s loads only ", dir,
                "/*.toml, so gpufence's drop-in must be one of them (default ",
                default_drop_in.string(), ")");

  auto root = read(root_path);
  if (!root) return std::unexpected(root.error());
  int version = 0;
  std::string version_why;
  ContainerdConfig base;
  if (!root->has_value()) {
    // k0s writes it when its worker starts (setupConfig); until then what it will write is
    // known only from the containerd it runs, or from the user.
    if (opt.version) {
      version = *opt.version;
      version_why = "--config-version";
    } else if (opt.node_version) {
      version = *opt.node_version >= 3 ? 3 : 2;
      version_why = cat("the running containerd writes version ", *opt.node_version);
    } else {
      return fail(Errc::not_found, root_path,
                  " does not exist: k0s writes it when its worker starts, and the drop-in must "
                  "have its version. Start k0s first, or pass --config-version (2 for k0s with "
                  "containerd 1.x, before 1.36; 3 from 1.36)");
    }
    if (version != 2 && version != 3)
      return fail(Errc::invalid_argument, "--config-version ", version,
                  ": k0s writes version 2 (containerd 1.x) or 3 (containerd 2.x)");
    base.path = root_path;
    base.version = version;
  } else {
    auto cfg = parse_containerd_config(**root, root_path);
    if (!cfg) return std::unexpected(cfg.error());
    version = cfg->version;
    version_why = cat(root_path, "'s version");
    if (k0s_managed(**root)) {
      if (version != 2 && version != 3)
        return fail(Errc::invalid_argument, root_path, " is version ", version,
                    ": k0s writes version 2 (containerd 1.x) or 3 (containerd 2.x), so what it "
                    "does with a drop-in here is unknown; nothing written");
    } else if (version < 3 || !imports_path(*cfg, drop_in)) {
      // Not k0s's any more: k0s leaves containerd.d alone (docs/runtime.md), and only
      // containerd's own import of the drop-in (versions 3-4 merge it) would still apply it.
      return fail(Errc::unsupported, root_path, " is not managed by k0s (its first line is not \"",
                  kK0sManaged, "\"), so k0s does not apply ", dir, "/*.toml",
                  version < 3
                      ? " (and containerd 1.x replaces whole plugin sections from an import)"
                      : ", and the file does not import " + drop_in,
                  ": nothing written. Add the handler to that file itself (gpufence setup "
                  "containerd --config ",
                  root_path, "), or give it back to k0s (remove it and restart k0s)");
    }
    if (opt.version && *opt.version != version)
      return fail(Errc::invalid_argument, "--config-version ", *opt.version, ": ", root_path,
                  " is version ", version, ", and the drop-in must be the same version");
    // k0s rewrites containerd.toml at its start: a file of the other containerd line is stale
    // (k0s upgraded or downgraded since), and a drop-in in its version would be refused.
    if (opt.node_version && (*opt.node_version >= 3) != (version >= 3))
      return fail(Errc::conflict, root_path, " is version ", version,
                  " but the running containerd writes version ", *opt.node_version,
                  ": k0s rewrites the file when it restarts; restart k0s, then run again");
    base = k0s_base_config(*cfg, read);
  }

  SetupPlan plan;
  plan.config_path = drop_in;
  plan.handler_name = opt.runtime_name;
  auto old_drop = read(drop_in);
  if (!old_drop) return std::unexpected(old_drop.error());
  const std::string& name = opt.runtime_name;
  toml::table drop;
  drop.insert_or_assign("version", version);
  add_handler(drop, version, base, opt, plan.notes);
  std::string text =
      cat("# gpufence's runtime handler for k0s (gpufence install, or setup containerd --flavor "
          "k0s).\n# ",
          version == 2 ? "k0s merges this file into /run/k0s/containerd-cri.toml"
                       : "containerd imports this file (k0s's containerd.toml lists containerd.d)",
          "; ", root_path, " is k0s's own.\n", serialize(drop));
  if (auto st = verify(text, drop_in, version, opt, name, true, DefaultRuntimeCheck::no); !st)
    return std::unexpected(st.error());
  if (text != old_drop->value_or(""))
    plan.changes.push_back(
        {drop_in, old_drop->has_value(), old_drop->value_or(""), text, LinkPolicy::refuse});
  plan.notes.push_back(cat("config version ", version, " (", version_why, "); k0s watches ", dir,
                           " and signals its containerd when it changes, which is not relied on"));
  plan.notes.push_back(
      cat("restart k0s to apply it now: systemctl restart k0sworker (k0scontroller "
          "on a controller with --enable-worker)"));
  return plan;
}

}  // namespace gpufence::setup_parts
