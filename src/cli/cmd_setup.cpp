#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "cli/commands.hpp"
#include "common/file.hpp"
#include "common/finding.hpp"
#include "common/hostfs.hpp"
#include "common/process.hpp"
#include "containerd/config.hpp"
#include "containerd/setup.hpp"
#include "distribution/distribution.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence::cli {
namespace {

// gpufence-runtime installed beside this gpufence binary, else the documented default.
std::string installed_runtime() {
  std::string sibling = beside_self("gpufence-runtime");
  if (sibling.starts_with("/") && ::access(sibling.c_str(), X_OK) == 0) return sibling;
  return std::string(kRuntimeBinaryPath);
}

}  // namespace

std::vector<Command> add_setup_commands(CLI::App& app, Context& ctx) {
  auto* setup = app.add_subcommand(
      "setup", "Write correct containerd runtime handlers, and check existing ones");
  setup->require_subcommand(1);

  // gpufence setup containerd
  struct SetupArgs {
    std::string flavor = "containerd", config, runtime_name = std::string(kDefaultHandlerName),
                binary = installed_runtime(), drop_in;
    bool set_as_default = false, include_node_agents = false, dry_run = false;
    int version = 0;
  };
  auto args = std::make_shared<SetupArgs>();
  auto* sc = setup->add_subcommand(
      "containerd", "Add a runtime handler that runs gpufence-runtime to containerd's config");
  sc->add_option("--flavor", args->flavor,
                 "The distribution, which picks the config file: " + distribution_names())
      ->capture_default_str();
  sc->add_option("--config", args->config, "Config file to edit (default per flavor)");
  sc->add_option("--runtime-name", args->runtime_name, "Handler name (the RuntimeClass's handler)")
      ->capture_default_str();
  sc->add_option("--binary", args->binary,
                 "Path of gpufence-runtime on the node (default: the one beside this gpufence)")
      ->capture_default_str();
  sc->add_option("--config-version", args->version,
                 "Config version for a new file or a k3s template (1 to 4)");
  sc->add_option("--drop-in", args->drop_in,
                 "Versions 3-4 only: drop-in path (default <config dir>/conf.d/99-gpufence.toml; "
                 "k0s: /etc/k0s/containerd.d/gpufence.toml)");
  sc->add_flag("--set-as-default", args->set_as_default,
               "Also make it containerd's default runtime (needs --include-node-agents)");
  sc->add_flag("--include-node-agents", args->include_node_agents,
               "Accept that with --set-as-default the node agents' own pods (the device plugin: "
               "privileged, no GPU request) run gpufence-runtime too and lose every GPU unless "
               "they use a RuntimeClass whose handler is plain runc");
  sc->add_flag("--dry-run", args->dry_run, "Print the diff, change nothing");
  sc->footer(
      "Examples:\n"
      "  gpufence setup containerd --dry-run\n"
      "  gpufence setup containerd --flavor microk8s --runtime-name nvidia\n"
      "Versions 1 and 2 are edited in place (containerd 1.x replaces whole plugin sections from\n"
      "imports); versions 3 and 4 get a drop-in of the root file's version, listed in imports\n"
      "unless an import glob already matches it. Only the lines it adds change; a\n"
      "backup is kept (never overwritten); a symlinked config stays a symlink; running twice\n"
      "changes nothing. k3s/rke2: a block in config.toml.tmpl (config-v3.toml.tmpl for\n"
      "containerd 2.x), renamed when k3s renders a runtime of that name itself. k0s: its own\n"
      "drop-in /etc/k0s/containerd.d/gpufence.toml in the version of k0s's containerd.toml,\n"
      "which is never edited (docs/install.md, \"Distributions\"). Prints the\n"
      "matching RuntimeClass manifest. Honours --host-root.");

  // gpufence setup check-containerd
  struct CheckArgs {
    std::string flavor = "containerd", config;
    std::vector<std::string> handlers;
    bool json = false;
  };
  auto check = std::make_shared<CheckArgs>();
  auto* cc = setup->add_subcommand(
      "check-containerd", "Report every problem in a containerd config for GPU pods, with the fix");
  cc->add_option("--flavor", check->flavor, "The distribution: " + distribution_names())
      ->capture_default_str();
  cc->add_option("--config", check->config, "Config file (default per flavor, under --host-root)");
  cc->add_option("--handler", check->handlers,
                 "RuntimeClass handler that must exist (repeatable; default nvidia)");
  cc->add_flag(
      "--json", check->json,
      "JSON output: {config, version, findings: [{id, severity, summary, evidence, fix}]}");
  cc->footer(
      "Example:\n  gpufence setup check-containerd --flavor microk8s\nExit: 0 clean, 1 errors "
      "found, 2 could not read the config.");

  Runner run_setup = [args, &ctx] {
    auto flavor = parse_distribution(args->flavor);
    if (!flavor) {
      std::cerr << "gpufence setup containerd: " << flavor.error().message << "\n";
      return 2;
    }
    auto config = host_path_arg(args->config, "--config", ctx.host_root);
    auto drop_in = host_path_arg(args->drop_in, "--drop-in", ctx.host_root);
    if (!config || !drop_in) {
      std::cerr << "gpufence setup containerd: "
                << (config ? drop_in.error() : config.error()).message << "\n";
      return 2;
    }
    SetupOptions opt;
    opt.distribution = *flavor;
    opt.config_path = *config;
    opt.runtime_name = args->runtime_name;
    opt.binary = args->binary;
    opt.set_as_default = args->set_as_default;
    opt.node_agents =
        args->include_node_agents ? DefaultForNodeAgents::accept : DefaultForNodeAgents::refuse;
    opt.drop_in_path = *drop_in;
    if (args->version) opt.version = args->version;
    HostFs host(ctx.host_root);
    ReadFile read = [&host](const std::string& path) -> Result<std::optional<std::string>> {
      auto text = host.read(path);
      if (text) return std::optional<std::string>(std::move(*text));
      if (text.error().code == Errc::not_found) return std::optional<std::string>{};
      return std::unexpected(text.error());
    };
    IsExecutable executable = [&host](const std::string& path) {
      auto info = host.stat(path);
      // A link (update-alternatives) may point outside --host-root from here: k3s would follow
      // it on the host, so it counts.
      return info &&
             (info->type == FileType::symlink || (info->type != FileType::directory &&
                                                  ::access(host.resolve(path).c_str(), X_OK) == 0));
    };
    auto plan = plan_containerd_setup(opt, read, executable);
    // k0s merges its drop-ins into one table: the handler's name must be gpufence's alone.
    if (plan && distribution_row(*flavor).config_source == ConfigSource::drop_in_dir) {
      if (auto st = check_k0s_runtime_name(host, plan->config_path, plan->handler_name); !st)
        plan = std::unexpected(st.error());
    }
    if (!plan) {
      std::cerr << "gpufence setup containerd: " << plan.error().message << "\n";
      return 2;
    }
    for (const auto& change : plan->changes) {
      auto diff = unified_diff(change.old_text, change.new_text,
                               change.existed ? change.path : "/dev/null", change.path);
      if (diff) std::cout << *diff;
    }
    if (plan->changes.empty())
      std::cout << "containerd already has runtime '" << plan->handler_name
                << "': nothing to change\n";
    if (!args->dry_run && !plan->changes.empty()) {
      auto backups = apply_setup_plan(*plan, host);
      if (!backups) {
        std::cerr << "gpufence setup containerd: " << backups.error().message << "\n";
        return 2;
      }
      for (const auto& b : *backups) std::cout << "backup: " << b << "\n";
      for (const auto& c : plan->changes) std::cout << "wrote: " << c.path << "\n";
    } else if (args->dry_run && !plan->changes.empty()) {
      std::cout << "(dry run: nothing written)\n";
    }
    for (const auto& note : plan->notes) std::cout << "note: " << note << "\n";
    std::cout << "\n# RuntimeClass for pods to use it (kubectl apply -f -):\n"
              << runtime_class_manifest(plan->handler_name);
    return 0;
  };

  Runner run_check = [check, &ctx] {
    auto flavor = parse_distribution(check->flavor);
    if (!flavor) {
      std::cerr << "gpufence setup check-containerd: " << flavor.error().message << "\n";
      return 2;
    }
    HostFs host(ctx.host_root);
    auto config = host_path_arg(check->config, "--config", ctx.host_root);
    if (!config) {
      std::cerr << "gpufence setup check-containerd: " << config.error().message << "\n";
      return 2;
    }
    const DistributionRow& row = distribution_row(*flavor);
    std::string path = config->empty() ? std::string(row.config_input) : *config;
    // k0s: the drop-in directory is not a config; containerd reads the file k0s generates.
    if (config->empty() && row.config_source == ConfigSource::drop_in_dir)
      path = std::string(row.config_read);
    auto text = host.read(path);
    if (!text) {
      std::cerr << "gpufence setup check-containerd: " << text.error().message << "\n";
      return 2;
    }
    if (row.config_source == ConfigSource::go_template && text->find("{{") != std::string::npos) {
      std::cerr << "gpufence setup check-containerd: " << path
                << " is a Go template; check the config " << row.name
                << " renders from it (--config " << row.config_read << ")\n";
      return 2;
    }
    auto cfg = parse_containerd_config(*text, path);
    if (!cfg) {
      std::cerr << "gpufence setup check-containerd: " << cfg.error().message << "\n";
      return 2;
    }
    auto merged = merge_imports_from_host(*cfg, host);
    if (!merged) {
      std::cerr << "gpufence setup check-containerd: " << merged.error().message << "\n";
      return 2;
    }
    ContainerdCheckOptions opt;
    if (!check->handlers.empty()) opt.handlers = check->handlers;
    opt.host = &host;
    opt.expect_gpufence = true;
    auto findings = check_containerd_config(*merged, opt);
    if (check->json) {
      // The doctor's finding objects and printing (common/finding.hpp): a --handler name is any
      // bytes, and the keys keep the documented order.
      std::cout << report_json_text(
          {{"config", path}, {"version", merged->version}, {"findings", findings_json(findings)}});
    } else if (findings.empty()) {
      std::cout << path << ": no problems found for handler(s) " << opt.handlers.front() << "\n";
    } else {
      std::cout << findings_text(findings);
    }
    return has_errors(findings) ? 1 : 0;
  };

  return {{sc, run_setup}, {cc, run_check}};
}

}  // namespace gpufence::cli
