// `gpufence install` / `gpufence uninstall`: thin flags over src/install.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "cdi/generate.hpp"
#include "cdi/spec.hpp"
#include "cli/commands.hpp"
#include "common/hostfs.hpp"
#include "common/process.hpp"
#include "common/stop_signals.hpp"
#include "gpu/nvml_inventory.hpp"
#include "gpu/wire_contract.hpp"
#include "install/install.hpp"
#include "install/watch.hpp"
#include "runtime/config.hpp"

namespace gpufence::cli {
namespace {

// `name` beside this gpufence binary (the image ships gpufence-runtime and gpufence-nri with it).
std::string sibling(const std::string& name) {
  return beside_self(name);
}

// The library's defaults, read once: the flags' defaults are taken from them, never retyped.
const InstallOptions& defaults() {
  static const InstallOptions options;
  return options;
}

struct InstallArgs {
  std::string distribution = "auto", config, socket, restart_command, host_exec = "auto",
              runtime_name = defaults().runtime_name, runtime_source = sibling("gpufence-runtime"),
              nri_source = sibling("gpufence-nri"), nri_link = defaults().nri_binary.link,
              nri_plugin_path = defaults().nri_plugin_path, runtime_link = defaults().binary.link,
              versions_dir = defaults().binary.versions_dir,
              runtime_config = defaults().runtime_config, state_file = defaults().state_file,
              cdi = "generate", cdi_output = defaults().cdi_output, driver_root = "/",
              healthz = "127.0.0.1:9402", enforcement = "auto", nri_socket = defaults().nri_socket,
              nri_plugin_name = defaults().nri_plugin_name, nri_tolerate_annotation,
              node_agent_namespace;
  std::vector<std::string> gpu_cdi_kinds;
  double ready_timeout = defaults().ready_timeout.count() / 1000.0, interval = 30,
         lock_timeout = defaults().lock_timeout.count() / 1000.0;
  int host_pid = 1;
  int config_version = 0;
  bool watch = false;
};

void add_common_flags(CLI::App* c, InstallArgs& a) {
  c->add_option("--distribution", a.distribution, "auto, " + distribution_names())
      ->capture_default_str();
  c->add_option("--containerd-config", a.config,
                "Host path of the config to edit (default: the distribution's)");
  c->add_option("--containerd-socket", a.socket,
                "Host path of containerd's socket (default: the distribution's)");
  c->add_option("--restart-command", a.restart_command,
                "Shell command that restarts containerd (default: the distribution's)");
  c->add_option("--host-exec", a.host_exec,
                "How host commands run: auto (direct with --host-root /, else nsenter), direct, "
                "nsenter (into PID 1's namespaces; needs hostPID)")
      ->capture_default_str();
  c->add_option("--host-pid", a.host_pid,
                "--host-exec nsenter: the process whose namespaces are the host's")
      ->capture_default_str();
  c->add_option("--runtime-link", a.runtime_link, "Host path containerd's BinaryName names")
      ->capture_default_str();
  c->add_option("--versions-dir", a.versions_dir, "Host directory of the versioned binaries")
      ->capture_default_str();
  c->add_option("--state-file", a.state_file, "Host path of the record uninstall reads")
      ->capture_default_str();
  c->add_option("--ready-timeout", a.ready_timeout,
                "Seconds containerd may take to answer after a restart")
      ->capture_default_str();
  c->add_option("--lock-timeout", a.lock_timeout,
                "Seconds to wait for another install or uninstall on this node to finish (one "
                "runs at a time: a lock file beside --state-file); then fail, changing nothing")
      ->capture_default_str();
}

Result<InstallOptions> to_options(const InstallArgs& a, const Context& ctx) {
  InstallOptions o;
  if (a.distribution != "auto") {
    auto d = parse_distribution(a.distribution);
    if (!d) return std::unexpected(d.error());
    o.distribution = *d;
  }
  o.config_path = a.config;
  o.socket = a.socket;
  if (!a.restart_command.empty()) o.restart_command = {"sh", "-c", a.restart_command};
  if (a.host_exec == "auto")
    o.host_exec = HostFs(ctx.host_root).root() == "/" ? HostExec::direct : HostExec::nsenter;
  else if (a.host_exec == "direct")
    o.host_exec = HostExec::direct;
  else if (a.host_exec == "nsenter")
    o.host_exec = HostExec::nsenter;
  else
    return fail(Errc::invalid_argument, "--host-exec: '", a.host_exec, "' (auto, direct, nsenter)");
  if (a.host_pid < 1) return fail(Errc::invalid_argument, "--host-pid must be a process id");
  o.host_pid = a.host_pid;
  o.runtime_name = a.runtime_name;
  auto enforcement = parse_enforcement_request(a.enforcement);
  if (!enforcement) return std::unexpected(enforcement.error());
  o.enforcement = *enforcement;
  o.nri_socket = a.nri_socket;
  o.nri_plugin_name = a.nri_plugin_name;
  o.nri_tolerate_annotation = a.nri_tolerate_annotation;
  o.node_agent_namespace = a.node_agent_namespace;
  for (const auto& kind : a.gpu_cdi_kinds)
    if (auto st = check_gpu_cdi_kind(kind); !st)
      return std::unexpected(st.error().wrap("--gpu-cdi-kind"));
  o.gpu_cdi_kinds = a.gpu_cdi_kinds;
  o.binary.source = a.runtime_source;
  o.binary.link = a.runtime_link;
  o.binary.versions_dir = a.versions_dir;
  o.nri_binary.source = a.nri_source;
  o.nri_binary.link = a.nri_link;
  o.nri_binary.versions_dir = a.versions_dir;
  o.nri_plugin_path = a.nri_plugin_path;
  o.runtime_config = a.runtime_config;
  o.state_file = a.state_file;
  if (a.cdi != "generate" && a.cdi != "skip")
    return fail(Errc::invalid_argument, "--cdi: '", a.cdi, "' (generate, skip)");
  o.cdi = a.cdi == "skip" ? CdiMode::skip : CdiMode::generate;
  o.cdi_output = a.cdi_output;
  if (a.config_version) o.config_version = a.config_version;
  if (a.ready_timeout <= 0) return fail(Errc::invalid_argument, "--ready-timeout must be > 0");
  o.ready_timeout = std::chrono::milliseconds(static_cast<long>(a.ready_timeout * 1000));
  if (a.lock_timeout < 0) return fail(Errc::invalid_argument, "--lock-timeout must be >= 0");
  o.lock_timeout = std::chrono::milliseconds(static_cast<long>(a.lock_timeout * 1000));
  return o;
}

// The NVML this installer loads (--nvml-library, a path under --host-root), as the host names
// it, for the runtime.toml it writes: only for a driver outside the host's root ("/"), whose
// library the runtimes' default search (libnvidia-ml.so.1 on the library path) cannot find.
std::string nvml_host_path(const Context& ctx, const std::string& driver_root) {
  if (driver_root.empty() || driver_root == "/" || ctx.nvml_library.empty()) return {};
  std::string root = ctx.host_root;
  while (root.size() > 1 && root.ends_with('/')) root.pop_back();
  if (root == "/") return ctx.nvml_library.starts_with("/") ? ctx.nvml_library : std::string();
  if (!ctx.nvml_library.starts_with(root + "/")) return {};
  return ctx.nvml_library.substr(root.size());
}

CdiSpecSource nvml_cdi_source(const Context& ctx, const HostFs& host, std::string driver_root) {
  return [&ctx, &host, driver_root](const std::string& hook_path) -> Result<std::string> {
    auto inventory = NvmlInventory::open(nvml_library_path(ctx.nvml_library), host);
    if (!inventory) return std::unexpected(inventory.error());
    auto gpus = (*inventory)->gpus();
    if (!gpus) return std::unexpected(gpus.error());
    CdiGenerateOptions opt;
    opt.driver_root = driver_root;
    opt.hook_path = hook_path;
    auto spec = generate_cdi_spec(host, *gpus, (*inventory)->driver_version(), opt);
    if (!spec) return std::unexpected(spec.error());
    return cdi_spec_to_yaml(spec->spec);
  };
}

InstallEnv make_env(const HostFs& host, ProcessRunner& runner, RuntimeProbe& probe,
                    CdiSpecSource cdi, std::string_view command) {
  InstallEnv env{host,
                 runner,
                 probe,
                 std::move(cdi),
                 [](std::chrono::milliseconds d) { std::this_thread::sleep_for(d); },
                 [] { return std::chrono::steady_clock::now(); }};
  env.progress = [command](std::string_view line) {
    std::cerr << "gpufence " << command << ": " << line << "\n" << std::flush;
  };
  return env;
}

// `install --watch`: the loop is install/watch.cpp's; here it gets stdout, stderr and SIGTERM.
int watch(const InstallOptions& opt, const InstallEnv& env, const InstallArgs& args,
          const InstallReport& first, const StopSignals& stop) {
  WatchOptions watch;
  watch.healthz_address = args.healthz;
  watch.interval = std::chrono::milliseconds(static_cast<long>(args.interval * 1000));
  WatchHooks hooks{
      [&stop] { return stop.stop_requested(); },
      [](const InstallReport& report) { std::cout << render_install_report(report) << std::flush; },
      [](std::string_view line) { std::cerr << "gpufence install --watch: " << line << "\n"; }};
  if (auto st = watch_install(opt, env, first, watch, hooks); !st) {
    std::cerr << "gpufence install --watch: " << st.error().message << "\n";
    return 2;
  }
  return 0;
}

}  // namespace

std::vector<Command> add_install_commands(CLI::App& app, Context& ctx) {
  auto in = std::make_shared<InstallArgs>();
  auto* install = app.add_subcommand(
      "install", "Install gpufence-runtime on this node and wire it into containerd, verified");
  add_common_flags(install, *in);
  install->add_option("--runtime-name", in->runtime_name, "Handler name (the RuntimeClass's)")
      ->capture_default_str();
  install
      ->add_option("--enforcement", in->enforcement,
                   "auto (nri where containerd has NRI >= v0.10, i.e. >= 2.2, else runtime), nri "
                   "(gpufence-nri in containerd), runtime (the RuntimeClass handler), both")
      ->capture_default_str();
  install->add_option("--nri-socket", in->nri_socket, "Host path of containerd's NRI socket")
      ->capture_default_str();
  install
      ->add_option("--nri-plugin-name", in->nri_plugin_name,
                   "The name gpufence-nri registers (required_plugins on containerd >= 2.2)")
      ->capture_default_str();
  install
      ->add_option("--nri-tolerate-annotation", in->nri_tolerate_annotation,
                   "containerd >= 2.2: a pod annotation key (default none) with which a pod "
                   "starts while gpufence-nri is down. NRI reads it from the pod (KEY, KEY/pod, "
                   "KEY/container.NAME), so it is a waiver every pod holds unless an admission "
                   "policy forbids it; a key an earlier install wrote is taken out")
      ->capture_default_str();
  install->add_option("--node-agent-namespace", in->node_agent_namespace,
                      "The Kubernetes namespace gpufence's device plugin runs in (the chart passes "
                      "its release's): the runtime.toml install creates lists it in [nri] "
                      "node_agent_namespaces, whose containers gpufence-nri leaves as containerd "
                      "made them, so the plugin keeps the GPUs NVML opens. Whoever may create pods "
                      "there gets every GPU");
  install
      ->add_option("--gpu-cdi-kind", in->gpu_cdi_kinds,
                   "A CDI kind of another allocator whose devices are GPUs, e.g. "
                   "k8s.gpu.nvidia.com/claim for NVIDIA's DRA driver (repeat, or comma-separate): "
                   "written as [cdi] gpu_kinds into the runtime.toml install creates, so "
                   "gpufence-nri and the shim enforce those claims by the GPU nodes their CDI "
                   "specs give")
      ->delimiter(',');
  install
      ->add_option("--nri-source", in->nri_source,
                   "gpufence-nri to copy onto the host in nri and both modes (default: beside "
                   "this binary)")
      ->capture_default_str();
  install->add_option("--nri-link", in->nri_link, "Host path of gpufence-nri's stable link")
      ->capture_default_str();
  install
      ->add_option("--nri-plugin-path", in->nri_plugin_path,
                   "Host path of containerd's NRI plugin_path: gpufence-nri is linked there as "
                   "10-<nri-plugin-name> (and on containerd >= 2.2 as 20-gpufence-fence) and "
                   "containerd launches it")
      ->capture_default_str();
  install
      ->add_option("--runtime-source", in->runtime_source,
                   "gpufence-runtime to copy onto the host (default: beside this binary)")
      ->capture_default_str();
  install
      ->add_option("--runtime-config", in->runtime_config,
                   "Host path of runtime.toml, written with defaults when absent")
      ->capture_default_str();
  install->add_option("--cdi", in->cdi, "generate (the CDI spec from NVML) or skip")
      ->capture_default_str();
  install->add_option("--cdi-output", in->cdi_output, "Host path of the CDI spec")
      ->capture_default_str();
  install
      ->add_option("--driver-root", in->driver_root,
                   "Host path where the driver lives (GPU Operator: /run/nvidia/driver)")
      ->capture_default_str();
  install->add_option(
      "--config-version", in->config_version,
      "Version for a new containerd config (1 to 4; default: what the running containerd writes)");
  install->add_flag("--watch", in->watch,
                    "Stay up: serve /healthz and re-install when containerd loses the handler");
  // Loopback by default: run on a host, the port is no one else's business. In a pod (the chart's
  // node installer) pass 0.0.0.0:PORT: the kubelet's httpGet probe connects to the pod's IP.
  install
      ->add_option("--healthz-address", in->healthz,
                   "--watch: /healthz and /metrics address (in a pod: 0.0.0.0:9402, where the "
                   "kubelet's probe reaches it)")
      ->capture_default_str();
  install->add_option("--interval", in->interval, "--watch: seconds between checks")
      ->capture_default_str();
  install->footer(
      "Steps: plan everything (a refusal changes nothing); write the record naming every file\n"
      "it will touch; copy gpufence-runtime (versioned file + atomic link); write runtime.toml\n"
      "if absent; generate the CDI spec; add the handler to containerd's config (setup\n"
      "containerd, with a backup; config versions 1-4; on k0s its own drop-in\n"
      "/etc/k0s/containerd.d/gpufence.toml, never k0s's containerd.toml); restart containerd\n"
      "(k0s: its unit) only if needed;\n"
      "verify the running containerd has the handler (CRI status). Any failure: exit 1, this\n"
      "run's changes taken back. After a kill, the next install finishes, uninstall undoes.\n"
      "One install or uninstall at a time: a second one waits for the first (--lock-timeout,\n"
      "default 60 s), then fails without changing anything.\n"
      "Examples:\n"
      "  gpufence install\n"
      "  gpufence --host-root /host install --distribution microk8s --watch   # in a DaemonSet");

  auto un = std::make_shared<InstallArgs>();
  auto* uninstall = app.add_subcommand(
      "uninstall", "Undo gpufence install: restore containerd's config, remove what it added");
  add_common_flags(uninstall, *un);
  uninstall->footer(
      "Restores the config from the backup install made (only if unedited since), restarts\n"
      "containerd, checks the handler is gone, removes the binary, the CDI spec and the\n"
      "runtime.toml install wrote (if unedited). Waits for an install still running on the\n"
      "node (--lock-timeout), then fails without changing anything.");

  Runner run_install_cmd = [in, &ctx] {
    auto opt = to_options(*in, ctx);
    if (!opt) {
      std::cerr << "gpufence install: " << opt.error().message << "\n";
      return 2;
    }
    // --watch stops on SIGTERM, blocked before the first install starts gRPC's threads
    // (common/stop_signals.hpp); a SIGTERM during that install ends the watch as soon as it begins,
    // so the install itself is never cut off half way.
    std::optional<StopSignals> stop;
    if (in->watch) {
      auto blocked = StopSignals::block();
      if (!blocked) {
        std::cerr << "gpufence install --watch: " << blocked.error().message << "\n";
        return 2;
      }
      stop.emplace(std::move(*blocked));
    }
    opt->nvml_library = nvml_host_path(ctx, in->driver_root);
    HostFs host(ctx.host_root);
    SystemProcessRunner runner;
    auto probe = make_cri_probe();
    auto env =
        make_env(host, runner, *probe, nvml_cdi_source(ctx, host, in->driver_root), "install");
    auto report = run_install(*opt, env);
    std::cout << render_install_report(report) << std::flush;
    if (stop) return watch(*opt, env, *in, report, *stop);
    return report.ok() ? 0 : 1;
  };
  Runner run_uninstall_cmd = [un, &ctx] {
    auto opt = to_options(*un, ctx);
    if (!opt) {
      std::cerr << "gpufence uninstall: " << opt.error().message << "\n";
      return 2;
    }
    HostFs host(ctx.host_root);
    SystemProcessRunner runner;
    auto probe = make_cri_probe();
    auto env = make_env(host, runner, *probe, nullptr, "uninstall");
    auto report = run_uninstall(*opt, env);
    std::cout << render_install_report(report) << std::flush;
    return report.ok() ? 0 : 1;
  };
  return {{install, run_install_cmd}, {uninstall, run_uninstall_cmd}};
}

}  // namespace gpufence::cli
