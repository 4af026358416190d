#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include <iostream>

#include "cli/commands.hpp"
#include "common/file.hpp"
#include "common/hostfs.hpp"
#include "common/process.hpp"
#include "containerd/config.hpp"
#include "containerd/setup.hpp"

namespace gpufence::cli {
namespace {

// gpufence-runtime installed beside this gpufence binary, else the documented default.
std::string installed_runtime() {
  std::error_code ec;
  auto self = std::filesystem::canonical("/proc/self/exe", ec);
  if (!ec) {
    auto sibling = self.parent_path() / "gpufence-runtime";
    if (::access(sibling.c_str(), X_OK) == 0) return sibling.string();
  }
  return "/usr/local/bin/gpufence-runtime";
}

void print_findings(const std::vector<Finding>& findings, std::ostream& out) {
  for (const auto& f : findings) {
    out << severity_name(f.severity) << ": " << f.summary << "\n"
        << "  id:       " << f.id << "\n"
        << "  evidence: " << f.evidence << "\n"
        << "  fix:      " << f.fix << "\n";
  }
}

nlohmann::json findings_json(const std::vector<Finding>& findings) {
  auto arr = nlohmann::json::array();
  for (const auto& f : findings) {
    arr.push_back({{"id", f.id},
                   {"severity", severity_name(f.severity)},
                   {"summary", f.summary},
                   {"evidence", f.evidence},
                   {"fix", f.fix}});
  }
  return arr;
}

}  // namespace

std::vector<Command> add_setup_commands(CLI::App& app, Context& ctx) {
  auto* setup = app.add_subcommand(
      "setup", "Write correct containerd runtime handlers, and check existing ones");
  setup->require_subcommand(1);

  // gpufence setup containerd
  struct SetupArgs {
    std::string flavor = "containerd", config, runtime_name = "nvidia",
                binary = installed_runtime(), drop_in;
    bool set_as_default = false, dry_run = false;
    int version = 0;
  };
  auto args = std::make_shared<SetupArgs>();
  auto* sc = setup->add_subcommand(
      "containerd", "Add a runtime handler that runs gpufence-runtime to containerd's config");
  sc->add_option("--flavor", args->flavor, "containerd, microk8s or k3s (picks the config file)")
      ->capture_default_str();
  sc->add_option("--config", args->config, "Config file to edit (default per flavor)");
  sc->add_option("--runtime-name", args->runtime_name, "Handler name (the RuntimeClass's handler)")
      ->capture_default_str();
  sc->add_option("--binary", args->binary,
                 "Path of gpufence-runtime on the node (default: the one beside this gpufence)")
      ->capture_default_str();
  sc->add_option("--config-version", args->version,
                 "Config version for a new file or a k3s template (1, 2 or 3)");
  sc->add_option("--drop-in", args->drop_in,
                 "Version 3 only: drop-in path (default <config dir>/conf.d/99-gpufence.toml)");
  sc->add_flag("--set-as-default", args->set_as_default,
               "Also make it containerd's default runtime");
  sc->add_flag("--dry-run", args->dry_run, "Print the diff, change nothing");
  sc->footer(
      "Examples:\n"
      "  gpufence setup containerd --dry-run\n"
      "  gpufence setup containerd --flavor microk8s --runtime-name nvidia\n"
      "Versions 1 and 2 are edited in place (containerd 1.x replaces whole plugin sections from\n"
      "imports); version 3 gets a drop-in listed in imports. A backup is kept; running twice\n"
      "changes nothing. Prints the matching RuntimeClass manifest.");

  // gpufence setup check-containerd
  struct CheckArgs {
    std::string flavor = "containerd", config;
    std::vector<std::string> handlers;
    bool json = false;
  };
  auto check = std::make_shared<CheckArgs>();
  auto* cc = setup->add_subcommand(
      "check-containerd", "Report every problem in a containerd config for GPU pods, with the fix");
  cc->add_option("--flavor", check->flavor, "containerd, microk8s or k3s")->capture_default_str();
  cc->add_option("--config", check->config, "Config file (default per flavor, under --host-root)");
  cc->add_option("--handler", check->handlers,
                 "RuntimeClass handler that must exist (repeatable; default nvidia)");
  cc->add_flag("--json", check->json,
               "JSON output: {config, findings: [{id, severity, summary, evidence, fix}]}");
  cc->footer(
      "Example:\n  gpufence setup check-containerd --flavor microk8s\nExit: 0 clean, 1 errors "
      "found, 2 could not read the config.");

  Runner run_setup = [args, &ctx] {
    auto flavor = parse_flavor(args->flavor);
    if (!flavor) {
      std::cerr << "gpufence setup containerd: " << flavor.error().message << "\n";
      return 2;
    }
    SetupOptions opt;
    opt.flavor = *flavor;
    opt.config_path = args->config;
    opt.runtime_name = args->runtime_name;
    opt.binary = args->binary;
    opt.set_as_default = args->set_as_default;
    opt.drop_in_path = args->drop_in;
    if (args->version) opt.version = args->version;
    ReadFile read = [](const std::string& path) -> Result<std::optional<std::string>> {
      auto text = read_file(path);
      if (text) return std::optional<std::string>(std::move(*text));
      if (text.error().code == Errc::not_found) return std::optional<std::string>{};
      return std::unexpected(text.error());
    };
    auto plan = plan_containerd_setup(opt, read);
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
      std::cout << "containerd already has runtime '" << opt.runtime_name
                << "': nothing to change\n";
    if (!args->dry_run && !plan->changes.empty()) {
      auto backups = apply_setup_plan(*plan);
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
              << runtime_class_manifest(opt.runtime_name);
    return 0;
  };

  Runner run_check = [check, &ctx] {
    auto flavor = parse_flavor(check->flavor);
    if (!flavor) {
      std::cerr << "gpufence setup check-containerd: " << flavor.error().message << "\n";
      return 2;
    }
    HostFs host(ctx.host_root);
    std::string path = check->config.empty() ? default_config_path(*flavor) : check->config;
    auto text = host.read(path);
    if (!text) {
      std::cerr << "gpufence setup check-containerd: " << text.error().message << "\n";
      return 2;
    }
    if (*flavor == Flavor::k3s && text->find("{{") != std::string::npos) {
      std::cerr << "gpufence setup check-containerd: " << path
                << " is a Go template; check the config k3s renders from it "
                   "(/var/lib/rancher/k3s/agent/etc/containerd/config.toml)\n";
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
      std::cout << nlohmann::json{{"config", path},
                                  {"version", merged->version},
                                  {"findings", findings_json(findings)}}
                       .dump(2)
                << "\n";
    } else if (findings.empty()) {
      std::cout << path << ": no problems found for handler(s) " << opt.handlers.front() << "\n";
    } else {
      print_findings(findings, std::cout);
    }
    return has_errors(findings) ? 1 : 0;
  };

  return {{sc, run_setup}, {cc, run_check}};
}

}  // namespace gpufence::cli
