#include <filesystem>
#include <iostream>

#include "cli/commands.hpp"
#include "common/file.hpp"
#include "common/hostfs.hpp"
#include "common/http_server.hpp"
#include "common/log.hpp"
#include "common/stop_signals.hpp"
#include "common/strings.hpp"
#include "doctor/agent.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/metrics.hpp"
#include "doctor/node_report.hpp"
#include "doctor/report.hpp"
#include "gpu/nvml_inventory.hpp"
#include "kube/client.hpp"

#include <cstdlib>
#include <optional>

namespace gpufence::cli {

namespace {
std::string absolute_path(std::string& value) {
  return std::filesystem::path(value).is_absolute() ? "" : "must be an absolute host path";
}

// --serve: the agent's runs until SIGTERM, its /metrics and /healthz on `address`.
int serve_doctor(const RunDoctor& run, KubeClient* kube, const DoctorAgentOptions& opt,
                 const std::string& address, const std::string& health_address,
                 const StopSignals& stop) {
  Logger log;
  DoctorAgent agent(run, kube, opt, log);
  const std::string stale = "no doctor run finished within three intervals";
  auto fresh = [&] { return agent.fresh(); };
  HttpServer http, health;
  if (!health_address.empty()) {
    if (auto st = health.start(health_address, {nullptr, fresh, stale}); !st) {
      std::cerr << "gpufence doctor: --health-address: " << st.error().message << "\n";
      return 2;
    }
  }
  auto st =
      http.start(address, {[&] { return agent.metrics(); },
                           health_address.empty() ? std::function<bool()>(fresh) : nullptr, stale});
  if (!st) {
    std::cerr << "gpufence doctor: --serve: " << st.error().message << "\n";
    return 2;
  }
  log.info("doctor.serve", {{"address", address},
                            {"port", std::to_string(http.port())},
                            {"interval_s", std::to_string(opt.interval.count())},
                            {"report_node", opt.report_node ? "true" : "false"}});
  agent.run([&](std::chrono::milliseconds wait) { return stop.wait_for(wait); });
  http.stop();
  health.stop();
  log.info("doctor.stopped");
  return 0;
}

// A one-shot --report-node: the condition, then an Event per error or warning.
Status report_node_once(KubeClient& kube, const std::string& node, const DoctorRun& run) {
  if (auto st = set_node_condition(
          kube, node, isolation_condition(run.findings, run.snapshot.allocations.has_value()));
      !st)
    return st;
  FindingEvents events(node, {std::string(kDoctorEventController), node});
  return events.post_new(kube, run.findings);
}
}  // namespace

std::vector<Command> add_doctor_command(CLI::App& app, Context& ctx) {
  struct Args {
    GatherOptions gather;
    std::string pod_resources_socket, containerd_config;
    std::vector<std::string> handlers, runc_roots, plugin_dirs;
    std::string kubeconfig, node_name;
    bool in_cluster = false;
    bool json = false, metrics = false, report_node = false;
    std::string serve, health_address;
    long interval_s = 60;
    std::vector<std::string> system_daemonsets, gpu_dra_drivers;
    long held_after_s = 300;
  };
  auto args = std::make_shared<Args>();
  auto* d = app.add_subcommand(
      "doctor",
      "Find and explain every place where GPU allocation and reality differ on this node");
  d->add_option("--pod-resources-socket", args->pod_resources_socket,
                "Kubelet PodResources socket (default: the first found of " +
                    join(every_distribution(NodePath::pod_resources_socket), ", ") + ")");
  d->add_flag("--probe", args->gather.probe,
              "Measure what each container can open: a helper joins its devices cgroup and opens "
              "each GPU node");
  d->add_option("--app-config", args->gather.app_configs,
                "DeepStream config path inside containers to check gpu-id keys of (repeatable)");
  d->add_option("--handler", args->handlers,
                "RuntimeClass handler GPU pods use (repeatable; default nvidia)");
  d->add_option("--containerd-config", args->containerd_config,
                "containerd config to check (default: the first found of " +
                    join(every_distribution(NodePath::containerd_config), ", ") + ")");
  d->add_option("--runc-root", args->runc_roots,
                "Extra runc state root to find bundles in (repeatable)");
  d->add_option("--device-plugin-dir", args->plugin_dirs,
                "Kubelet device plugin directory: its sockets and the kubelet's device checkpoint "
                "(repeatable; default: each of " +
                    join(every_distribution(NodePath::device_plugin_dir), ", ") + ")");
  d->add_option("--resource-name", args->gather.resource_name, "Extended resource of the GPUs")
      ->capture_default_str();
  d->add_option("--kubeconfig", args->kubeconfig,
                "Read this node's pods, RuntimeClasses and capacity from the API server");
  d->add_flag("--in-cluster", args->in_cluster, "Same, with the pod's service account");
  d->add_option("--node-name", args->node_name,
                "This node's name in the API (default: $NODE_NAME, else the host's hostname)");
  d->add_option("--install-state", args->gather.install_state,
                "gpufence install's record (which enforcement the node was given), a host path")
      ->capture_default_str()
      ->check(CLI::Validator(absolute_path, "ABSOLUTE", ""));
  d->add_option("--nri-status", args->gather.nri_status,
                "gpufence-nri's status file (runtime.toml [nri] status_file), a host path")
      ->capture_default_str()
      ->check(CLI::Validator(absolute_path, "ABSOLUTE", ""));
  d->add_option("--runtime-config", args->gather.runtime_config,
                "gpufence's runtime.toml, a host path: its [cdi] gpu_kinds name another DRA "
                "driver's CDI kinds, whose claims count as the GPUs their specs give")
      ->capture_default_str()
      ->check(CLI::Validator(absolute_path, "ABSOLUTE", ""));
  d->add_option("--system-namespace", args->gather.system_namespace,
                "The namespace gpufence was installed in: its own pods there, controlled by its "
                "DaemonSets, are expected to reach every GPU (default with --in-cluster: the "
                "doctor's own namespace; else none)");
  d->add_option("--system-daemonset", args->system_daemonsets,
                "A DaemonSet of gpufence's in --system-namespace (repeatable; default " +
                    join(GatherOptions{}.system_daemonsets, ", ") + ")");
  d->add_option("--gpu-dra-driver", args->gpu_dra_drivers,
                "A DRA driver whose devices are GPUs (repeatable; default " +
                    join(GatherOptions{}.gpu_dra_drivers, ", ") + ")");
  d->add_option("--gpu-held-after", args->held_after_s,
                "Seconds a pod may hold GPUs with no container running before it is named "
                "(pod.gpu-held-without-container)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  auto* json = d->add_flag("--json", args->json, "JSON report (schema gpufence.doctor/v1)");
  d->add_flag("--metrics", args->metrics,
              "Print the findings as Prometheus metrics instead of a report (docs/monitoring.md)")
      ->excludes(json);
  d->add_option("--serve", args->serve,
                "Run as a node agent: the doctor every --interval, its metrics on /metrics and "
                "/healthz at HOST:PORT (e.g. :9403); stops on SIGTERM");
  d->add_option("--health-address", args->health_address,
                "With --serve: /healthz on a listener and thread of its own at HOST:PORT (e.g. "
                ":9404), so a flood of /metrics clients cannot fail the liveness probe");
  d->add_option("--interval", args->interval_s, "Seconds between the agent's runs (--serve)")
      ->capture_default_str()
      ->check(CLI::Range(5L, 86400L));
  d->add_flag("--report-node", args->report_node,
              "Set the Node condition GPUIsolation and post an Event for each new error or "
              "warning (on the pod it names, else the Node); needs --in-cluster or --kubeconfig");
  d->footer(
      "Examples:\n"
      "  gpufence doctor --probe\n"
      "  gpufence --host-root /host doctor --json      (from a pod: "
      "deploy/kubernetes/doctor-job.yaml)\n"
      "  gpufence --host-root /host doctor --in-cluster --probe --serve :9403 --report-node\n"
      "Exit: 0 clean, 1 findings of error severity, 2 could not run (--serve: 0 on SIGTERM).");

  return {
      {d, [args, &ctx] {
         // A served agent stops on SIGTERM: the signals are blocked before any thread
         // (gRPC, libcurl) exists, so none of them takes the signal's default action.
         std::optional<StopSignals> stop;
         if (!args->serve.empty()) {
           auto signals = StopSignals::block();
           if (!signals) {
             std::cerr << "gpufence doctor: " << signals.error().message << "\n";
             return 2;
           }
           stop = std::move(*signals);
         }
         HostFs host(ctx.host_root);
         GatherOptions opt = args->gather;
         if (!args->pod_resources_socket.empty())
           opt.pod_resources_sockets = {args->pod_resources_socket};
         if (!args->containerd_config.empty()) {
           auto cfg = host_path_arg(args->containerd_config, "--containerd-config", ctx.host_root);
           if (!cfg) {
             std::cerr << "gpufence doctor: " << cfg.error().message << "\n";
             return 2;
           }
           opt.containerd_configs = {*cfg};
         }
         if (!args->handlers.empty()) opt.handlers = args->handlers;
         if (!args->system_daemonsets.empty()) opt.system_daemonsets = args->system_daemonsets;
         if (!args->gpu_dra_drivers.empty()) opt.gpu_dra_drivers = args->gpu_dra_drivers;
         opt.held_after = std::chrono::seconds(args->held_after_s);
         if (opt.system_namespace.empty() && args->in_cluster) {
           // The doctor's own pod runs in the install's namespace (the chart's Job,
           // CronJob and agent DaemonSet): its service account says which.
           if (auto ns =
                   HostFs("/").read("/var/run/secrets/kubernetes.io/serviceaccount/namespace"))
             opt.system_namespace = std::string(trim(*ns));
         }
         if (!args->plugin_dirs.empty()) opt.plugin_dirs = args->plugin_dirs;
         opt.runc_roots.insert(opt.runc_roots.end(), args->runc_roots.begin(),
                               args->runc_roots.end());
         if (!host.exists("/proc")) {
           std::cerr << "gpufence doctor: " << host.resolve("/proc").string()
                     << " does not exist (wrong --host-root?)\n";
           return 2;
         }
         GatherSources sources;
         auto nvml = NvmlInventory::open(nvml_library_path(ctx.nvml_library), host);
         if (nvml)
           sources.inventory = **nvml;
         else
           sources.inventory = std::unexpected(nvml.error());
         std::unique_ptr<KubeClient> kube;
         if (!args->kubeconfig.empty() || args->in_cluster) {
           auto creds = load_credentials(args->in_cluster ? std::string() : args->kubeconfig);
           if (creds) {
             kube = make_rest_client(*creds);
             sources.kube = *kube;
           } else {
             sources.kube = std::unexpected(creds.error());
           }
         }
         if (args->report_node && !kube) {
           std::cerr << "gpufence doctor: --report-node needs the API server: "
                     << (args->kubeconfig.empty() && !args->in_cluster
                             ? std::string("give --in-cluster or --kubeconfig")
                             : sources.kube.error().message)
                     << "\n";
           return 2;
         }
         std::string node = args->node_name;
         if (node.empty()) {
           if (const char* env = std::getenv("NODE_NAME"); env && *env)
             node = env;
           else if (auto h = host.read("/etc/hostname"))
             node = std::string(trim(*h));
         }
         sources.node_name = node;
         RunDoctor run_once = [&] {
           Snapshot snap = gather_snapshot(host, opt, sources);
           auto findings = judge(snap);
           return DoctorRun{std::move(snap), std::move(findings)};
         };
         DoctorAgentOptions agent_opt{std::chrono::seconds(args->interval_s), args->report_node,
                                      node};
         if (stop)
           return serve_doctor(run_once, kube.get(), agent_opt, args->serve, args->health_address,
                               *stop);
         auto began = std::chrono::system_clock::now();
         DoctorRun r = run_once();
         auto ended = std::chrono::system_clock::now();
         if (args->report_node) {
           if (auto st = report_node_once(*kube, node, r); !st)
             std::cerr << "gpufence doctor: --report-node: " << st.error().message << "\n";
         }
         if (args->metrics)
           std::cout << render_doctor_metrics(r.snapshot, r.findings, {1, ended, ended - began});
         else if (args->json)
           std::cout << report_json_text(render_doctor_json(r.snapshot, r.findings));
         else
           std::cout << render_doctor_text(r.snapshot, r.findings);
         return doctor_exit_code(r.findings);
       }}};
}

}  // namespace gpufence::cli
