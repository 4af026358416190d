#include <iostream>

#include "autoscale/run.hpp"
#include "cli/commands.hpp"
#include "common/stop_signals.hpp"
#include "kube/object_ref.hpp"

namespace gpufence::cli {
namespace {}  // namespace

std::vector<Command> add_autoscale_command(CLI::App& app, Context& ctx) {
  struct Args {
    AutoscaleOptions opt;
    std::string deployment, streams_file, streams_configmap, kubeconfig, lease, identity;
    bool in_cluster = false, once = false, no_leader_election = false;
    int period = 15, lease_duration = 0;
  };
  auto args = std::make_shared<Args>();
  auto* a = app.add_subcommand(
      "autoscale",
      "Scale a DeepStream Deployment by stream demand, never past the free GPU capacity");
  a->add_option("--deployment", args->deployment, "NAMESPACE/NAME of the Deployment")->required();
  a->add_option("--streams-per-pod", args->opt.streams_per_pod, "Streams one pod handles")
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
  a->add_option("--lease", args->lease,
                "NAMESPACE/NAME of the coordination.k8s.io Lease replicas elect a leader on "
                "(default: the Deployment's namespace, gpufence-autoscale-NAME)");
  a->add_option("--lease-duration", args->lease_duration,
                "Seconds a leader's Lease lasts unrenewed (default: 3 periods, at least 15)");
  a->add_option("--identity", args->identity,
                "This replica's name in the Lease and Events (default: $POD_NAME or hostname, "
                "and the pid)");
  a->add_flag("--no-leader-election", args->no_leader_election,
              "Scale without holding the Lease (only when a single replica runs)");
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
      "by the GPUs new pods can use: nodes that are Ready, not cordoned, matching the template's\n"
      "nodeSelector and with every NoSchedule/NoExecute taint tolerated; allocatable minus the\n"
      "effective requests of their pods, in whole pods (GPUs per pod from the template), minus\n"
      "pending pods and replicas not created yet. Scale-down waits for the highest recommendation\n"
      "of 5 minutes, scale-up at most max(100 %, 4 pods) per period. Only the Lease holder "
      "scales.");

  return {{a, [args, &ctx]() -> int {
             (void)ctx;
             auto deployment = parse_object_ref(args->deployment, "--deployment");
             if (!deployment) {
               std::cerr << "gpufence autoscale: " << deployment.error().message << "\n";
               return 2;
             }
             AutoscaleRun run;
             run.opt = args->opt;
             run.opt.ns = deployment->ns;
             run.opt.deployment = deployment->name;
             if (args->streams_file.empty() == args->streams_configmap.empty()) {
               std::cerr << "gpufence autoscale: give exactly one of --streams-file and "
                            "--streams-configmap\n";
               return 2;
             }
             run.streams_file = args->streams_file;
             run.streams_configmap = args->streams_configmap;
             if (!args->no_leader_election) {
               auto lease = lease_options(
                   run.opt, args->lease,
                   args->identity.empty() ? default_identity() : args->identity,
                   std::chrono::seconds(args->lease_duration), std::chrono::seconds(args->period));
               if (!lease) {
                 std::cerr << "gpufence autoscale: " << lease.error().message << "\n";
                 return 2;
               }
               run.lease = *lease;
             }
             run.instance = run.lease ? run.lease->identity : default_identity();
             auto creds = load_credentials(args->in_cluster ? std::string() : args->kubeconfig);
             if (!creds) {
               std::cerr << "gpufence autoscale: " << creds.error().message << "\n";
               return 2;
             }
             // Blocked before the client's watch starts its threads (common/stop_signals.hpp):
             // the loop ends after its reconcile and gives the Lease back.
             auto stop = StopSignals::block();
             if (!stop) {
               std::cerr << "gpufence autoscale: " << stop.error().message << "\n";
               return 2;
             }
             auto kube = make_rest_client(*creds);
             AutoscaleLoop loop;
             loop.period = std::chrono::seconds(args->period);
             loop.repeat = args->once ? Repeat::once : Repeat::every_period;
             loop.stop_requested = [&stop] { return stop->stop_requested(); };
             loop.report = [&](const Controller::Step& step) {
               write_step(std::cout, std::cerr, args->deployment, step, run.opt.dry_run);
             };
             loop.clock = system_loop_clock();
             auto end = run_autoscale(*kube, run, loop, [](std::string_view line) {
               std::cerr << "gpufence autoscale: " << line << std::endl;
             });
             if (!end.released)
               std::cerr << "gpufence autoscale: " << end.released.error().message << std::endl;
             return end.last_step_failed ? 1 : 0;
           }}};
}

}  // namespace gpufence::cli
