#include "autoscale/controller.hpp"

#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "kube/object_ref.hpp"

namespace gpufence {
namespace {

ScaleEvent describe_scale(const ReconcileResult& r) {
  ScaleEvent e;
  e.reason = r.desired > r.current ? "ScaledUp" : "ScaledDown";
  e.note = cat("replicas ", r.current, " -> ", r.desired, ": ", r.reason, "; free GPUs ",
               r.free_gpus, " on ", r.capacity.schedulable_nodes, " of ", r.capacity.nodes,
               " node(s), ", r.gpus_per_pod, " per pod");
  return e;
}

}  // namespace

ClusterSource cluster_from_lists(KubeClient& kube, const std::string& node_selector) {
  // The watch's own list (every page, restarted on an expired continue token), without the watch.
  return [&kube, node_selector]() -> Result<ClusterView> {
    WatchCache nodes(kube, "/api/v1/nodes", WatchOptions{node_selector, "", 500, {}, {}});
    WatchCache pods(kube, "/api/v1/pods", WatchOptions{"", kLivePods, 500, {}, {}});
    if (auto st = nodes.relist(); !st) return std::unexpected(st.error());
    if (auto st = pods.relist(); !st) return std::unexpected(st.error());
    return ClusterView{nodes.items().value(), pods.items().value()};
  };
}

ClusterWatch::ClusterWatch(KubeClient& kube, const std::string& node_selector)
    : m_nodes(kube, "/api/v1/nodes",
              WatchOptions{node_selector, "", 500, std::chrono::seconds(300), project_node}),
      m_pods(kube, "/api/v1/pods",
             WatchOptions{"", kLivePods, 500, std::chrono::seconds(300), project_pod}) {}

Status ClusterWatch::start() {
  auto nodes = m_nodes.relist();
  auto pods = m_pods.relist();
  m_nodes.start();
  m_pods.start();
  if (!nodes) return nodes;
  return pods;
}

void ClusterWatch::stop() {
  m_nodes.stop();
  m_pods.stop();
}

ClusterSource ClusterWatch::source() {
  return [this]() -> Result<ClusterView> {
    auto nodes = m_nodes.items();
    if (!nodes) return std::unexpected(nodes.error());
    auto pods = m_pods.items();
    if (!pods) return std::unexpected(pods.error());
    return ClusterView{std::move(*nodes), std::move(*pods)};
  };
}

Result<ReconcileResult> reconcile(KubeClient& kube, const AutoscaleOptions& opt,
                                  const StreamSource& streams, const ClusterSource& cluster,
                                  Stabilizer& stabilizer, SteadyTime now,
                                  const EventSource* events) {
  ReconcileResult out;
  // 1. Demand.
  auto demand = streams();
  if (!demand) return std::unexpected(demand.error().wrap("stream demand"));
  out.streams = *demand;
  // 2. The Deployment: what one pod requests, where it may run, how many it asked for.
  auto deployment =
      kube.get(cat("/apis/apps/v1/namespaces/", opt.ns, "/deployments/", opt.deployment));
  if (!deployment) return std::unexpected(deployment.error().wrap("read Deployment"));
  auto dv = deployment_view(*deployment, opt.resource);
  if (!dv) return std::unexpected(dv.error());
  out.gpus_per_pod = dv->pod.gpus;
  out.deployment = *dv;
  // 3. Capacity new pods can use: schedulable nodes only, whole pods per node, minus what
  //    pending pods and not-yet-created replicas will take.
  auto view = cluster();
  if (!view) return std::unexpected(view.error().wrap("free GPU capacity"));
  out.capacity = free_capacity(view->nodes, view->pods, *dv, opt.resource);
  out.free_gpus = out.capacity.free_gpus;
  // 4. Recommend, stabilise, write with optimistic concurrency.
  const std::string path =
      cat("/apis/apps/v1/namespaces/", opt.ns, "/deployments/", opt.deployment, "/scale");
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto scale = kube.get(path);
    if (!scale) return std::unexpected(scale.error().wrap("read scale"));
    out.current = scale->value("spec", nlohmann::json::object()).value("replicas", 0L);
    auto rec = recommend({out.streams, opt.streams_per_pod, out.current, opt.min_replicas,
                          opt.max_replicas, out.gpus_per_pod, out.free_gpus, 0.1});
    out.reason = rec.reason;
    out.capped = rec.capped_by_gpus;
    // Only the first attempt feeds the stabiliser: a retry is the same decision, re-applied.
    out.desired = attempt == 0 ? stabilizer.stabilize(rec.replicas, out.current, now) : out.desired;
    if (out.desired == out.current || opt.dry_run) return out;
    (*scale)["spec"]["replicas"] = out.desired;
    auto written = kube.request("PUT", path, scale->dump());
    if (written) {
      out.scaled = true;
      // 5. Say so where users look (kubectl describe/events); a failure here changes nothing.
      if (events) {
        if (auto st = post_scale_event(kube, *dv, *events, describe_scale(out)); !st)
          out.event_error = st.error().message;
      }
      return out;
    }
    if (written.error().code != Errc::conflict)
      return std::unexpected(written.error().wrap("write scale"));
    // 409: someone changed the Deployment since we read it; read again and re-apply.
  }
  return fail(Errc::conflict, "scale of ", opt.ns, "/", opt.deployment,
              " kept changing under us (3 conflicts)");
}

Controller::Controller(KubeClient& kube, AutoscaleOptions opt, StreamSource streams,
                       ClusterSource cluster, EventSource events, std::optional<LeaseOptions> lease)
    : m_kube(kube),
      m_opt(std::move(opt)),
      m_streams(std::move(streams)),
      m_cluster(std::move(cluster)),
      m_events(std::move(events)) {
  if (lease) m_elector.emplace(kube, std::move(*lease));
}

Controller::Step Controller::step(SteadyTime now) {
  Step s;
  if (m_elector) {
    auto leading = m_elector->try_acquire_or_renew(now);
    if (!leading) {
      s.leader = false;
      s.error = leading.error();
      return s;
    }
    s.leader = *leading;
    s.holder = m_elector->holder();
    if (!s.leader) return s;
  }
  auto r = reconcile(m_kube, m_opt, m_streams, m_cluster, m_stabilizer, now, &m_events);
  if (!r) {
    s.error = r.error();
    return s;
  }
  // Demand the GPUs cannot meet is a decision too (not to scale further): one Warning when it
  // starts, so `kubectl describe` says why the Deployment stays short, without one per period.
  if (r->capped && !m_capped && !m_opt.dry_run) {
    ScaleEvent e{"Warning", "ScaleUpCappedByGpus",
                 cat(r->reason, "; free GPUs ", r->free_gpus, " on ", r->capacity.schedulable_nodes,
                     " of ", r->capacity.nodes, " node(s)")};
    if (auto st = post_scale_event(m_kube, r->deployment, m_events, e); !st)
      r->event_error = st.error().message;
  }
  m_capped = r->capped;
  if (!m_opt.dry_run) report_notices(*r);
  s.result = std::move(*r);
  return s;
}

void Controller::report_notices(ReconcileResult& r) {
  // Pods left out of the demand are named where the Deployment's owners look: a tenant's pod
  // that can never be scheduled no longer freezes scale-up, and nobody is left wondering why
  // it did not count. A quantity that does not parse is a Warning: that node or pod's GPUs were
  // counted as taken. At most kPerPeriod new Events per period, so a flood of such pods cannot
  // turn into a flood of Events; the rest follow in later periods.
  constexpr int kPerPeriod = 10;
  struct Kind {
    const std::vector<Notice>* notices;
    const char* type;
    const char* reason;
  } kinds[] = {{&r.capacity.ignored, "Normal", "PendingPodNotCounted"},
               {&r.capacity.unreadable, "Warning", "UnreadableQuantity"}};
  std::set<std::string> still;
  int posted = 0;
  for (const auto& k : kinds) {
    for (const auto& n : *k.notices) {
      std::string key = cat(n.object, "|", k.reason, "|", n.kind);
      if (m_noticed.contains(key)) {
        still.insert(key);
        continue;
      }
      if (posted >= kPerPeriod) continue;
      ++posted;
      // The pod's name and what it asked for are a tenant's bytes: data in the note.
      ScaleEvent e{k.type, k.reason, escape_text(n.object + ": " + n.why)};
      if (auto st = post_scale_event(m_kube, r.deployment, m_events, e); !st) {
        r.event_error = st.error().message;  // not remembered: tried again next period
        continue;
      }
      still.insert(key);
    }
  }
  m_noticed = std::move(still);
}

Status Controller::shutdown() {
  return m_elector ? m_elector->release() : Status{};
}

StreamSource streams_from_configmap(KubeClient& kube, const std::string& spec) {
  return [&kube, spec]() -> Result<long> {
    auto ref = parse_object_key_ref(spec, "--streams-configmap");
    if (!ref) return std::unexpected(ref.error());
    auto cm =
        kube.get(cat("/api/v1/namespaces/", ref->object.ns, "/configmaps/", ref->object.name));
    if (!cm) return std::unexpected(cm.error());
    const std::string& key = ref->key;
    auto data = cm->value("data", nlohmann::json::object());
    if (!data.contains(key) || !data[key].is_string())
      return fail(Errc::not_found, "ConfigMap ", spec, " has no key ", key);
    auto n = parse_number<long>(trim(data[key].get<std::string>()));
    if (!n || *n < 0)
      return fail(Errc::parse, "ConfigMap ", spec, ": '", data[key].get<std::string>(),
                  "' is not a stream count");
    return *n;
  };
}

StreamSource streams_from_file(const std::string& path) {
  return [path]() -> Result<long> {
    auto text = read_file(path);
    if (!text) return std::unexpected(text.error());
    auto n = parse_number<long>(trim(*text));
    if (!n || *n < 0) return fail(Errc::parse, path, ": '", trim(*text), "' is not a stream count");
    return *n;
  };
}

}  // namespace gpufence
