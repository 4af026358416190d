#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "autoscale/controller.hpp"
#include "cli/commands.hpp"
#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/hostfs.hpp"

namespace gpufence::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;  // set by SIGTERM/SIGINT: the loop ends after its reconcile
void on_stop(int) {
  g_stop = 1;
}

// Who this replica is in the Lease and in Events: the pod's name (the Downward API's POD_NAME, or
// HOSTNAME, which a pod's hostname defaults to) plus the pid, as client-go adds a unique part.
std::string default_identity() {
  const char* pod = std::getenv("POD_NAME");
  if (!pod || !*pod) pod = std::getenv("HOSTNAME");
  char host[256] = "gpufence-autoscale";
  if (!pod || !*pod) {
    if (::gethostname(host, sizeof host) == 0) host[sizeof host - 1] = '\0';
    pod = host;
  }
  return std::string(pod) + "_" + std::to_string(::getpid());
}

void print_step(const std::string& deployment, const Controller::Step& s, bool dry_run) {
  if (s.error) {
    std::cerr << "gpufence autoscale: " << s.error->message << " (nothing changed)" << std::endl;
    return;
  }
  if (!s.leader) {
    std::cout << "gpufence autoscale: standby: the lease is held by " << s.holder << std::endl;
    return;
  }
  const auto& r = *s.result;
  std::cout << "gpufence autoscale: " << deployment << ": " << r.reason << "; free GPUs "
            << r.free_gpus << " on " << r.capacity.schedulable_nodes << "/" << r.capacity.nodes
            << " node(s), " << r.gpus_per_pod << " per pod; replicas " << r.current << " -> "
            << r.desired
            << (r.scaled                            ? " (scaled)"
                : dry_run && r.desired != r.current ? " (dry run)"
                                                    : "")
            << std::endl;
  for (const auto& why : r.capacity.skipped)
    std::cout << "gpufence autoscale:   skipped node " << escape_text(why) << std::endl;
  for (const auto& n : r.capacity.ignored)
    std::cout << "gpufence autoscale:   not demand: " << escape_text(n.object + ": " + n.why)
              << std::endl;
  for (const auto& n : r.capacity.unreadable)
    std::cerr << "gpufence autoscale:   unreadable quantity: "
              << escape_text(n.object + ": " + n.why) << " (counted as taken)" << std::endl;
  if (!r.event_error.empty())
    std::cerr << "gpufence autoscale: " << r.event_error << " (the scale stands)" << std::endl;
}

}  // namespace

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
             std::optional<LeaseOptions> lease;
             if (!args->no_leader_election) {
               LeaseOptions l;
               std::string spec = args->lease.empty()
                                      ? args->opt.ns + "/gpufence-autoscale-" + args->opt.deployment
                                      : args->lease;
               auto ls = spec.find('/');
               if (ls == std::string::npos || ls == 0 || ls + 1 == spec.size()) {
                 std::cerr << "gpufence autoscale: --lease wants NAMESPACE/NAME, got '" << spec
                           << "'\n";
                 return 2;
               }
               l.ns = spec.substr(0, ls);
               l.name = spec.substr(ls + 1);
               l.identity = args->identity.empty() ? default_identity() : args->identity;
               // Longer than a period, or the leader's own renewals would lapse between them.
               l.duration = std::chrono::seconds(args->lease_duration > 0
                                                     ? args->lease_duration
                                                     : std::max(15, 3 * std::max(1, args->period)));
               lease = l;
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
             // --once lists; a loop keeps nodes and pods by list + watch instead of listing the
             // cluster's pods every period.
             std::unique_ptr<ClusterWatch> watch;
             ClusterSource cluster;
             if (args->once) {
               cluster = cluster_from_lists(*kube, args->opt.node_selector);
             } else {
               watch = std::make_unique<ClusterWatch>(*kube, args->opt.node_selector);
               if (auto st = watch->start(); !st)
                 std::cerr << "gpufence autoscale: " << st.error().message
                           << " (retrying in the background)" << std::endl;
               cluster = watch->source();
             }
             EventSource events;
             events.instance = lease ? lease->identity : default_identity();
             Controller controller(*kube, args->opt, source, cluster, events, lease);
             std::signal(SIGTERM, on_stop);
             std::signal(SIGINT, on_stop);
             int failures = 0;
             while (true) {
               auto s = controller.step(std::chrono::steady_clock::now());
               print_step(args->deployment, s, args->opt.dry_run);
               failures = s.error ? failures + 1 : 0;
               if (args->once || g_stop) break;
               for (int i = 0; i < args->period * 10 && !g_stop; ++i)
                 std::this_thread::sleep_for(std::chrono::milliseconds(100));
               if (g_stop) break;
             }
             if (auto st = controller.shutdown(); !st)
               std::cerr << "gpufence autoscale: " << st.error().message << std::endl;
             if (watch) watch->stop();
             return failures ? 1 : 0;
           }}};
}

}  // namespace gpufence::cli
