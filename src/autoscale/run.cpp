#include "autoscale/run.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <thread>

#include "common/escape.hpp"
#include "kube/object_ref.hpp"

namespace gpufence {

using std::chrono::milliseconds;

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

Result<LeaseOptions> lease_options(const AutoscaleOptions& opt, const std::string& spec,
                                   std::string identity, std::chrono::seconds duration,
                                   std::chrono::seconds period) {
  const std::string name = spec.empty() ? opt.ns + "/gpufence-autoscale-" + opt.deployment : spec;
  auto ref = parse_object_ref(name, "--lease");
  if (!ref) return std::unexpected(ref.error());
  LeaseOptions l;
  l.ns = std::move(ref->ns);
  l.name = std::move(ref->name);
  l.identity = std::move(identity);
  // Longer than a period, or the leader's own renewals would lapse between them.
  l.duration =
      duration > std::chrono::seconds::zero()
          ? duration
          : std::max(std::chrono::seconds(15), 3 * std::max(std::chrono::seconds(1), period));
  return l;
}

LoopClock system_loop_clock() {
  return {[] { return std::chrono::steady_clock::now(); },
          [](milliseconds d) { std::this_thread::sleep_for(d); }};
}

LoopEnd run_autoscale_loop(Controller& controller, const AutoscaleLoop& loop) {
  // How often a sleeping loop looks at stop_requested: SIGTERM ends it within this.
  constexpr milliseconds kStopSlice{100};
  LoopEnd end;
  while (true) {
    auto step = controller.step(loop.clock.now());
    loop.report(step);
    end.last_step_failed = step.error.has_value();
    if (loop.repeat == Repeat::once || loop.stop_requested()) break;
    const auto until = loop.clock.now() + loop.period;
    for (auto now = loop.clock.now(); now < until && !loop.stop_requested(); now = loop.clock.now())
      loop.clock.sleep(std::min(kStopSlice, std::chrono::ceil<milliseconds>(until - now)));
    if (loop.stop_requested()) break;
  }
  end.released = controller.shutdown();
  return end;
}

LoopEnd run_autoscale(KubeClient& kube, const AutoscaleRun& run, const AutoscaleLoop& loop,
                      const std::function<void(std::string_view)>& say) {
  StreamSource source = run.streams_file.empty()
                            ? streams_from_configmap(kube, run.streams_configmap)
                            : streams_from_file(run.streams_file);
  // Once lists; a loop keeps nodes and pods by list + watch instead of listing the cluster's pods
  // every period.
  std::unique_ptr<ClusterWatch> watch;
  ClusterSource cluster;
  if (loop.repeat == Repeat::once) {
    cluster = cluster_from_lists(kube, run.opt.node_selector);
  } else {
    watch = std::make_unique<ClusterWatch>(kube, run.opt.node_selector);
    if (auto st = watch->start(); !st) say(st.error().message + " (retrying in the background)");
    cluster = watch->source();
  }
  EventSource events{std::string(kAutoscaleEventController), run.instance};
  Controller controller(kube, run.opt, source, cluster, events, run.lease);
  auto end = run_autoscale_loop(controller, loop);
  if (watch) watch->stop();
  return end;
}

void write_step(std::ostream& out, std::ostream& err, const std::string& deployment,
                const Controller::Step& s, bool dry_run) {
  if (s.error) {
    err << "gpufence autoscale: " << s.error->message << " (nothing changed)" << std::endl;
    return;
  }
  if (!s.leader) {
    out << "gpufence autoscale: standby: the lease is held by " << s.holder << std::endl;
    return;
  }
  const auto& r = *s.result;
  out << "gpufence autoscale: " << deployment << ": " << r.reason << "; free GPUs " << r.free_gpus
      << " on " << r.capacity.schedulable_nodes << "/" << r.capacity.nodes << " node(s), "
      << r.gpus_per_pod << " per pod; replicas " << r.current << " -> " << r.desired
      << (r.scaled                            ? " (scaled)"
          : dry_run && r.desired != r.current ? " (dry run)"
                                              : "")
      << std::endl;
  for (const auto& why : r.capacity.skipped)
    out << "gpufence autoscale:   skipped node " << escape_text(why) << std::endl;
  for (const auto& n : r.capacity.ignored)
    out << "gpufence autoscale:   not demand: " << escape_text(n.object + ": " + n.why)
        << std::endl;
  for (const auto& n : r.capacity.unreadable)
    err << "gpufence autoscale:   unreadable quantity: " << escape_text(n.object + ": " + n.why)
        << " (counted as taken)" << std::endl;
  if (!r.event_error.empty())
    err << "gpufence autoscale: " << r.event_error << " (the scale stands)" << std::endl;
}

}  // namespace gpufence
