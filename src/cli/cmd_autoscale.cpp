#include <csignal>
#include <iostream>
#include <thread>

#include "autoscale/controller.hpp"
#include "cli/commands.hpp"
#include "common/file.hpp"
#include "common/hostfs.hpp"

namespace gpufence::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;  // set by SIGTERM/SIGINT: the loop ends after its reconcile
void on_stop(int) {
  g_stop = 1;
}

}  // namespace

std::vector<Command> add_autoscale_command(CLI::App& app, Context& ctx) {
  struct Args {
    AutoscaleOptions opt;
    std::string deployment, streams_file, streams_configmap, kubeconfig;
    bool in_cluster = false, once = false;
    int period = 15;
  };
  auto args = std::make_shared<Args>();
  auto* a = app.add_subcommand(
      "autoscale",
      "Scale a DeepStream Deployment by stream demand, never past the free GPU capacity");
  a->add_option("--deployment", args->deployment, "NAMESPACE/NAME of the Deployment")->required();
  a->add_option("--streams-per-pod", args->opt.streams_per_pod, "Streams one pod handles")
      ->capture_default_str();
  a->add_option("--gpus-per-pod", args->opt.gpus_per_pod, "nvidia.com/gpu each pod requests")
      ->capture_default_str();
  a->add_option("--min", args->opt.min_replicas, "Fewest replicas")->capture_default_str();
  a->add_option("--max", args->opt.max_replicas, "Most replicas")->capture_default_str();
  a->add_option("--streams-file", args->streams_file,
                "Demand: a file holding the number of streams");
  a->add_option("--streams-configmap", args->streams_configmap,
                "Demand: NAMESPACE/NAME:KEY of a ConfigMap holding it");
  a->add_option("--node-selector", args->opt.node_selector,
                "Label selector of the GPU nodes (default: all nodes)");
  a->add_option("--period", args->period, "Seconds between reconciles")->capture_default_str();
  a->add_flag("--once", args->once, "Reconcile once and exit");
  a->add_flag("--dry-run", args->opt.dry_run, "Say what would be done, write nothing");
  a->add_option("--kubeconfig", args->kubeconfig, "kubeconfig (else --in-cluster)");
  a->add_flag("--in-cluster", args->in_cluster, "Use the pod's service account");
  a->footer(
      "Example:\n"
      "  gpufence autoscale --in-cluster --deployment video/deepstream --streams-per-pod 8 \\\n"
      "      --streams-configmap video/streams:count --max 2\n"
      "desired = ceil(streams / streams-per-pod) within [min, max], skipped inside a 10 % band, "
      "capped\n"
      "by free nvidia.com/gpu (allocatable minus requested, Pending pods included); scale-down "
      "waits\n"
      "for the highest recommendation of 5 minutes, scale-up at most max(100 %, 4 pods) per "
      "period.");

  return {{a, [args, &ctx]() -> int {
             (void)ctx;
             auto slash = args->deployment.find('/');
             if (slash == std::string::npos) {
               std::cerr << "gpufence autoscale: --deployment wants NAMESPACE/NAME\n";
               return 2;
             }
             args->opt.ns = args->deployment.substr(0, slash);
             args->opt.deployment = args->deployment.substr(slash + 1);
             if (args->streams_file.empty() == args->streams_configmap.empty()) {
               std::cerr << "gpufence autoscale: give exactly one of --streams-file and "
                            "--streams-configmap\n";
               return 2;
             }
             auto creds = load_credentials(args->in_cluster ? std::string() : args->kubeconfig);
             if (!creds) {
               std::cerr << "gpufence autoscale: " << creds.error().message << "\n";
               return 2;
             }
             auto kube = make_rest_client(*creds);
             StreamSource source = args->streams_file.empty()
                                       ? streams_from_configmap(*kube, args->streams_configmap)
                                       : streams_from_file(args->streams_file);
             Stabilizer stabilizer;
             std::signal(SIGTERM, on_stop);
             std::signal(SIGINT, on_stop);
             int failures = 0;
             while (true) {
               auto r = reconcile(*kube, args->opt, source, stabilizer,
                                  std::chrono::steady_clock::now());
               if (r) {
                 failures = 0;
                 std::cout << "gpufence autoscale: " << args->deployment << ": " << r->reason
                           << "; free GPUs " << r->free_gpus << "; replicas " << r->current
                           << " -> " << r->desired
                           << (r->scaled                                       ? " (scaled)"
                               : args->opt.dry_run && r->desired != r->current ? " (dry run)"
                                                                               : "")
                           << std::endl;
               } else {
                 ++failures;
                 std::cerr << "gpufence autoscale: " << r.error().message << " (nothing changed)"
                           << std::endl;
               }
               if (args->once) return r ? 0 : 1;
               for (int i = 0; i < args->period * 10 && !g_stop; ++i)
                 std::this_thread::sleep_for(std::chrono::milliseconds(100));
               if (g_stop) return failures ? 1 : 0;
             }
           }}};
}

}  // namespace gpufence::cli
