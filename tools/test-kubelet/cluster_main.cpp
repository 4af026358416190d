// gpufence-test-cluster: one GPU node of a cluster, for `gpufence autoscale` to scale against. No
// API server, controller manager, scheduler or kubelet can be installed here, so this plays all
// four for one node, each as the real one behaves (docs/containerd-lines.md, "The cluster mode"):
// - the API server (tests/support/test_api_server): the Node, whose nvidia.com/gpu capacity and
//   allocatable are what the registered device plugin advertises; the Deployment, its /scale
//   subresource; the streams ConfigMap; /api/v1/pods with the pods below and their real phases;
//   Events as clients post them; a kubeconfig for it;
// - the Deployment/ReplicaSet controller: pods created (Pending, unbound) while the scale's
//   spec.replicas exceeds the live pods, deleted (unbound ones first, then the newest) while it
//   is lower;
// - the scheduler: binds a Pending pod only if the node has the GPUs it requests free
//   (allocatable minus what bound, unfinished pods request); else the pod stays Pending with
//   PodScheduled=False, reason Unschedulable, kube-scheduler's message;
// - the kubelet: a bound pod is admitted through the real device plugin (GetPreferredAllocation
//   + Allocate, TestKubelet), run through the CRI with its RuntimeClass's handler (pod_runner),
//   marked Running, and the given command ExecSync'ed in it.
// Until --stop-file exists (or --limit), then every pod is stopped and removed through the CRI.
//
// Usage: gpufence-test-cluster --plugin-dir D --runtime-endpoint SOCK --image REF
//          --kubeconfig PATH --stop-file PATH [--runtime-class NAME] [--privileged]
//          [--cgroup-parent P] -- CMD [ARG...]
// Output lines (as gpufence-test-cri's, pods by name):
//   runtime <name> <version> <api version>
//   api <url>                                  (the kubeconfig is written)
//   node <name> allocatable <n>
//   pod <name> created
//   pod <name> foreign                         (a --foreign-pod, published)
//   pod <name> pending Unschedulable <the scheduler's message>
//   pod <name> bound <node>
//   pod <name> ids <id>[,<id>...]
//   pod <name> running <seconds from RunPodSandbox to RUNNING>
//   pod <name> container <CRI container id>
//   pod <name> exec <stdout line>
//   pod <name> probed                          (its exec is done)
//   pod <name> deleted
//   pod <name> error <step>: <message>
//   event <type> <reason> <note>               (an Event a client posted)
//   node <name> allocated <m> of <n>            (at the end)
#include <CLI/CLI.hpp>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "common/file.hpp"
#include "common/stop_signals.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "cri_client.hpp"
#include "kube/object_ref.hpp"
#include "pod_runner.hpp"
#include "support/test_api_server.hpp"
#include "test_kubelet.hpp"

namespace {

using json = nlohmann::json;
using gpufence::test::CriClient;
using gpufence::test::PodRun;
using gpufence::test::TestApiServer;
using gpufence::test::TestKubelet;

constexpr const char* kResource = "nvidia.com/gpu";
constexpr const char* kPods = "/api/v1/pods";
constexpr const char* kNodes = "/api/v1/nodes";
// The ReplicaSet's pod-template-hash: one template, one ReplicaSet.
constexpr const char* kTemplateHash = "6b8f9c7d5";

struct Options {
  std::string plugin_dir, endpoint, image, runtime_class, cgroup_parent, kubeconfig, stop_file;
  std::string node = "gpu-node-1";
  std::string deployment = "video/deepstream";
  std::string token = "test-token";
  bool privileged = false;
  int timeout_s = 30;
  int limit_s = 600;
  std::vector<std::string> exec;
  std::vector<json> foreign_pods;  // --foreign-pod: other teams' pods, never scheduled here
};

// A quantity of a countable resource ("1", or a bare number); anything else counts as none.
long quantity(const json& q) {
  if (q.is_number_integer()) return q.get<long>();
  if (!q.is_string()) return 0;
  const auto& s = q.get_ref<const std::string&>();
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stol(s);
}

// What the scheduler counts for a pod (its containers' requests, a limit standing in for an
// absent request as API defaulting does). Written here on purpose rather than shared with
// src/autoscale: the scheduler is the autoscaler's judge, not its copy.
long gpus_requested(const json& pod_spec) {
  long sum = 0;
  for (const auto& c : pod_spec.value("containers", json::array())) {
    auto resources = c.value("resources", json::object());
    auto requests = resources.value("requests", json::object());
    auto limits = resources.value("limits", json::object());
    sum += quantity(requests.contains(kResource) ? requests[kResource]
                                                 : limits.value(kResource, json()));
  }
  return sum;
}

// The one node, and the controllers and kubelet around it.
class Cluster {
 public:
  Cluster(const Options& opt, TestKubelet& kubelet, CriClient& cri, TestApiServer& api)
      : m_opt(opt), m_kubelet(kubelet), m_cri(cri), m_api(api) {
    auto ref =
        gpufence::parse_object_ref(opt.deployment, "--deployment").value();  // checked in main
    m_ns = ref.ns;
    m_name = ref.name;
    m_deployment_path = "/apis/apps/v1/namespaces/" + m_ns + "/deployments/" + m_name;
    m_scale_path = m_deployment_path + "/scale";
    m_events_path = "/apis/events.k8s.io/v1/namespaces/" + m_ns + "/events";
  }

  // Step 1: the objects a cluster with this Deployment has before anything scales it.
  void publish() {
    sync_node();
    json container = {{"name", "deepstream"},
                      {"image", m_opt.image},
                      {"command", {"/bin/sleep", "3600"}},
                      {"resources", {{"limits", {{kResource, "1"}}}}}};
    if (m_opt.privileged) container["securityContext"] = {{"privileged", true}};
    json pod_spec = {{"containers", json::array({container})}};
    if (!m_opt.runtime_class.empty()) pod_spec["runtimeClassName"] = m_opt.runtime_class;
    json labels = {{"app", m_name}};
    m_api.set_versioned(
        m_deployment_path,
        {{"apiVersion", "apps/v1"},
         {"kind", "Deployment"},
         {"metadata", {{"name", m_name}, {"namespace", m_ns}, {"uid", "uid-deployment-" + m_name}}},
         {"spec",
          {{"replicas", 0},
           {"selector", {{"matchLabels", labels}}},
           {"template", {{"metadata", {{"labels", labels}}}, {"spec", pod_spec}}}}},
         {"status", {{"replicas", 0}}}});
    // In the real API the Scale is a view of the Deployment; here a separate object that
    // clients read and write, mirrored into the Deployment by sync_deployment().
    m_api.set_versioned(m_scale_path,
                        {{"apiVersion", "autoscaling/v1"},
                         {"kind", "Scale"},
                         {"metadata", {{"name", m_name}, {"namespace", m_ns}}},
                         {"spec", {{"replicas", 0}}},
                         {"status", {{"replicas", 0}, {"selector", "app=" + m_name}}}});
    m_api.set_versioned("/api/v1/namespaces/" + m_ns + "/configmaps/streams",
                        {{"apiVersion", "v1"},
                         {"kind", "ConfigMap"},
                         {"metadata", {{"name", "streams"}, {"namespace", m_ns}}},
                         {"data", {{"count", "0"}}}});
    // The device plugin runs on the node as a DaemonSet's pod, asking no GPU (a cluster's pod
    // list is never empty; the autoscaler must not count it).
    m_api.apply(kPods, {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata",
                         {{"name", "gpufence-device-plugin-" + m_opt.node},
                          {"namespace", "kube-system"},
                          {"labels", {{"app.kubernetes.io/name", "gpufence-device-plugin"}}}}},
                        {"spec",
                         {{"nodeName", m_opt.node},
                          {"containers", {{{"name", "device-plugin"}, {"image", "gpufence"}}}}}},
                        {"status", {{"phase", "Running"}}}});
    // Other teams' pods this node's scheduler never places (a nodeSelector no node has, more
    // GPUs than any node): Pending and unbound for good, as kube-scheduler leaves them.
    for (json p : m_opt.foreign_pods) {
      p["status"] = {
          {"phase", "Pending"},
          {"conditions",
           {{{"type", "PodScheduled"}, {"status", "False"}, {"reason", "Unschedulable"}}}}};
      m_api.apply(kPods, p);
      std::cout << "pod " << p["metadata"].value("name", "") << " foreign" << std::endl;
    }
    std::cout << "node " << m_opt.node << " allocatable " << m_allocatable << std::endl;
  }

  // One pass of every actor, in the order a change flows through a cluster.
  void step() {
    sync_node();
    sync_deployment();
    replicaset();
    schedule();
    kubelet();
    report_events();
  }

  // Every pod stopped and removed through the CRI, as when the node is drained; the failures.
  int teardown() {
    int failed = static_cast<int>(m_errors.size());
    long allocated = 0;
    for (auto& p : m_pods) {
      allocated += static_cast<long>(p.run.ids.size());
      gpufence::test::teardown_pod(m_cri, p.run);
      if (!p.run.error.empty()) ++failed;
    }
    std::cout << "node " << m_opt.node << " allocated " << allocated << " of " << m_allocatable
              << std::endl;
    return failed;
  }

 private:
  enum class Phase { unbound, bound, running, failed };
  struct Pod {
    json object;  // as last written to the API
    Phase phase = Phase::unbound;
    bool reported_unschedulable = false;
    PodRun run;
  };

  // The kubelet's node status: capacity = every device the plugin advertised, allocatable = the
  // healthy ones (pkg/kubelet/cm/devicemanager GetCapacity).
  void sync_node() {
    long capacity = 0, allocatable = 0;
    for (const auto& [id, health] : m_kubelet.devices()) {
      ++capacity;
      if (health == "Healthy") ++allocatable;
    }
    if (capacity == m_capacity && allocatable == m_allocatable && !m_node.is_null()) return;
    m_capacity = capacity;
    m_allocatable = allocatable;
    m_node = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata",
         {{"name", m_opt.node},
          {"labels", {{"kubernetes.io/hostname", m_opt.node}, {"kubernetes.io/os", "linux"}}}}},
        {"spec", json::object()},
        {"status",
         {{"capacity", {{kResource, std::to_string(capacity)}}},
          {"allocatable", {{kResource, std::to_string(allocatable)}}},
          {"conditions",
           {{{"type", "Ready"},
             {"status", "True"},
             {"reason", "KubeletReady"},
             {"message", "kubelet is posting ready status"}}}}}}};
    m_api.apply(kNodes, m_node);
  }

  // The Scale's spec.replicas is the Deployment's (one field in the real API).
  void sync_deployment() {
    long replicas = m_api.object(m_scale_path)["spec"].value("replicas", 0L);
    auto d = m_api.object(m_deployment_path);
    if (d["spec"].value("replicas", 0L) == replicas && replicas == m_replicas) return;
    d["spec"]["replicas"] = replicas;
    d["status"]["replicas"] = static_cast<long>(m_pods.size());
    m_api.set_versioned(m_deployment_path, d);
    m_replicas = replicas;
  }

  // The ReplicaSet: as many pods as spec.replicas. A Failed pod is kept and not replaced, so an
  // admission failure shows once instead of as a stream of new pods.
  void replicaset() {
    while (static_cast<long>(m_pods.size()) < m_replicas) create_pod();
    while (static_cast<long>(m_pods.size()) > m_replicas) delete_pod(deletion_victim());
  }

  void create_pod() {
    auto d = m_api.object(m_deployment_path);
    const json& tmpl = d["spec"]["template"];
    Pod p;
    std::string name = m_name + "-" + kTemplateHash + "-" + std::to_string(++m_created);
    json labels = tmpl["metadata"].value("labels", json::object());
    labels["pod-template-hash"] = kTemplateHash;
    p.object = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", name},
                  {"namespace", m_ns},
                  {"uid", "uid-" + std::to_string(getpid()) + "-" + std::to_string(m_created)},
                  {"labels", labels},
                  {"creationTimestamp", gpufence::utc_rfc3339(std::chrono::system_clock::now(),
                                                              gpufence::SubSecond::none)},
                  {"ownerReferences",
                   {{{"apiVersion", "apps/v1"},
                     {"kind", "ReplicaSet"},
                     {"name", m_name + "-" + kTemplateHash},
                     {"controller", true}}}}}},
                {"spec", tmpl["spec"]},
                {"status", {{"phase", "Pending"}}}};
    m_pods.push_back(std::move(p));
    write(m_pods.back());
    std::cout << "pod " << name << " created" << std::endl;
  }

  // The ReplicaSet's ranking (controller_utils ActivePods): unscheduled before scheduled, Pending
  // before Running, then the newest first.
  size_t deletion_victim() const {
    size_t best = 0;
    auto rank = [](Phase ph) { return ph == Phase::unbound ? 0 : ph == Phase::bound ? 1 : 2; };
    for (size_t i = 1; i < m_pods.size(); ++i) {
      if (rank(m_pods[i].phase) <= rank(m_pods[best].phase)) best = i;
    }
    return best;
  }

  void delete_pod(size_t i) {
    Pod& p = m_pods[i];
    gpufence::test::teardown_pod(m_cri, p.run);
    // The device manager frees a pod's devices once it has terminated.
    m_kubelet.release(p.run.ids);
    m_api.remove(kPods, m_ns, pod_name(p));
    std::cout << "pod " << pod_name(p) << " deleted" << std::endl;
    if (!p.run.error.empty()) m_errors.push_back(pod_name(p) + ": " + p.run.error);
    m_pods.erase(m_pods.begin() + static_cast<long>(i));
  }

  // kube-scheduler's NodeResourcesFit for one node, in creation order.
  void schedule() {
    for (auto& p : m_pods) {
      if (p.phase != Phase::unbound) continue;
      long need = gpus_requested(p.object["spec"]);
      long held = 0;
      for (const auto& q : m_pods) {
        if (q.phase == Phase::bound || q.phase == Phase::running)
          held += gpus_requested(q.object["spec"]);
      }
      if (need <= m_allocatable - held) {
        p.object["spec"]["nodeName"] = m_opt.node;
        p.object["status"]["conditions"] = {{{"type", "PodScheduled"}, {"status", "True"}}};
        p.phase = Phase::bound;
        write(p);
        std::cout << "pod " << pod_name(p) << " bound " << m_opt.node << std::endl;
      } else if (!p.reported_unschedulable) {
        // kube-scheduler's words for a one-node cluster short of the resource (as
        // `kubectl describe pod` shows them; NVIDIA/k8s-device-plugin#430).
        std::string message = std::string("0/1 nodes are available: 1 Insufficient ") + kResource +
                              ". preemption: 0/1 nodes are available: 1 No preemption victims "
                              "found for incoming pod.";
        p.object["status"]["conditions"] = {{{"type", "PodScheduled"},
                                             {"status", "False"},
                                             {"reason", "Unschedulable"},
                                             {"message", message}}};
        p.reported_unschedulable = true;
        write(p);
        std::cout << "pod " << pod_name(p) << " pending Unschedulable " << message << std::endl;
      }
    }
  }

  // The kubelet: admit each pod bound here, run it through the CRI, look inside.
  void kubelet() {
    auto timeout = std::chrono::seconds(m_opt.timeout_s);
    for (auto& p : m_pods) {
      if (p.phase != Phase::bound) continue;
      const json& spec = p.object["spec"];
      const json& c = spec["containers"][0];
      auto& pod = p.run.pod;
      pod.name = pod_name(p);
      pod.namespace_ = m_ns;
      pod.uid = p.object["metadata"]["uid"];
      pod.container = c.value("name", "app");
      pod.image = c.value("image", "");
      pod.command = c.value("command", std::vector<std::string>{});
      pod.privileged = c.value("securityContext", json::object()).value("privileged", false);
      pod.cgroup_parent = m_opt.cgroup_parent;
      // The RuntimeClass's handler: here each RuntimeClass is named after its handler.
      std::string handler = spec.value("runtimeClassName", "");
      v1beta1::ContainerAllocateResponse alloc;
      long gpus = gpus_requested(spec);
      if (gpus > 0) {
        if (auto st = m_kubelet.admit(static_cast<int>(gpus), &alloc, &p.run.ids); !st.ok()) {
          // What the kubelet does when the device manager cannot admit a bound pod.
          fail(p, "UnexpectedAdmissionError", "Allocate: " + st.error_message());
          continue;
        }
        std::cout << "pod " << pod.name << " ids " << gpufence::join(p.run.ids, ",") << std::endl;
      }
      if (!gpufence::test::start_pod(m_cri, handler, alloc, timeout, p.run)) {
        fail(p, "CreateContainerError", p.run.error);
        continue;
      }
      p.phase = Phase::running;
      p.object["status"]["phase"] = "Running";
      p.object["status"]["conditions"] = {{{"type", "PodScheduled"}, {"status", "True"}},
                                          {{"type", "Ready"}, {"status", "True"}}};
      write(p);
      std::cout << "pod " << pod.name << " running " << p.run.running_s << "\n"
                << "pod " << pod.name << " container " << p.run.container_id << std::endl;
      if (!m_opt.exec.empty()) {
        gpufence::test::exec_in_pod(m_cri, pod.name, m_opt.exec, timeout, std::cout, p.run);
        if (p.run.error.empty())
          std::cout << "pod " << pod.name << " probed" << std::endl;
        else
          std::cout << "pod " << pod.name << " error " << p.run.error << std::endl;
      }
    }
  }

  void fail(Pod& p, const std::string& reason, const std::string& message) {
    p.run.error = message;
    p.phase = Phase::failed;
    p.object["status"]["phase"] = "Failed";
    p.object["status"]["reason"] = reason;
    p.object["status"]["message"] = message;
    write(p);
    std::cout << "pod " << pod_name(p) << " error " << message << std::endl;
  }

  void report_events() {
    auto posted = m_api.posted(m_events_path);
    for (; m_events_seen < posted.size(); ++m_events_seen) {
      const auto& e = posted[m_events_seen];
      std::cout << "event " << e.value("type", "") << " " << e.value("reason", "") << " "
                << e.value("note", "") << std::endl;
    }
  }

  void write(Pod& p) { m_api.apply(kPods, p.object); }
  static std::string pod_name(const Pod& p) { return p.object["metadata"].value("name", ""); }

  const Options& m_opt;
  TestKubelet& m_kubelet;
  CriClient& m_cri;
  TestApiServer& m_api;
  std::string m_ns, m_name, m_deployment_path, m_scale_path, m_events_path;
  json m_node;
  long m_capacity = -1, m_allocatable = -1, m_replicas = 0;
  int m_created = 0;
  size_t m_events_seen = 0;
  std::vector<Pod> m_pods;            // creation order
  std::vector<std::string> m_errors;  // of pods already deleted
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "gpufence-test-cluster: one GPU node (API server, ReplicaSet controller, "
      "scheduler, kubelet) for the autoscale scenario; not a cluster"};
  app.add_option("--plugin-dir", opt.plugin_dir, "Device plugin directory to serve kubelet.sock in")
      ->required();
  app.add_option("--runtime-endpoint", opt.endpoint, "The CRI socket (containerd's grpc address)")
      ->required();
  app.add_option("--image", opt.image, "The Deployment's image (already in the runtime's store)")
      ->required();
  app.add_option("--kubeconfig", opt.kubeconfig, "Write a kubeconfig for the API server here")
      ->required();
  app.add_option("--stop-file", opt.stop_file, "Tear everything down once this path exists")
      ->required();
  app.add_option("--runtime-class", opt.runtime_class,
                 "The template's runtimeClassName, also the CRI handler (empty: the default)");
  app.add_flag("--privileged", opt.privileged, "The template's container is privileged");
  app.add_option("--deployment", opt.deployment, "NAMESPACE/NAME of the Deployment")
      ->capture_default_str();
  app.add_option("--node-name", opt.node, "The node's name")->capture_default_str();
  app.add_option("--cgroup-parent", opt.cgroup_parent, "Pod cgroup parent (cgroupfs style)");
  app.add_option("--timeout", opt.timeout_s, "Seconds per step")->capture_default_str();
  app.add_option("--limit", opt.limit_s, "Seconds to run at most without the stop file")
      ->capture_default_str();
  std::vector<std::string> foreign;
  app.add_option("--foreign-pod", foreign,
                 "A pod object (JSON) of another namespace, published Pending and never scheduled")
      ->allow_extra_args(false);  // one value per flag: the `--` and the command stay theirs
  app.add_option("exec", opt.exec, "After --: the command ExecSync runs in each new pod");
  CLI11_PARSE(app, argc, argv);
  for (const auto& text : foreign) {
    json p = json::parse(text, nullptr, false);
    if (!p.is_object() || !p.contains("metadata") || !p["metadata"].is_object()) {
      std::cerr << "gpufence-test-cluster: --foreign-pod wants a pod object as JSON\n";
      return 2;
    }
    opt.foreign_pods.push_back(std::move(p));
  }
  if (auto ref = gpufence::parse_object_ref(opt.deployment, "--deployment"); !ref) {
    std::cerr << "gpufence-test-cluster: " << ref.error().message << "\n";
    return 2;
  }

  // SIGTERM/SIGINT tear down as the stop file does; blocked before the first thread starts
  // (common/stop_signals.hpp), so one that comes during set-up is seen by the loop in step 3.
  auto stop = gpufence::StopSignals::block();
  if (!stop) {
    std::cerr << "gpufence-test-cluster: " << stop.error().message << "\n";
    return 1;
  }

  // Step 1: the device plugin registers with the kubelet stand-in; the runtime answers.
  TestKubelet kubelet(opt.plugin_dir);
  kubelet.start();
  auto timeout = std::chrono::seconds(opt.timeout_s);
  if (!gpufence::test::wait_for_plugin(kubelet, timeout, "gpufence-test-cluster")) return 1;
  CriClient cri(opt.endpoint, timeout);
  if (!gpufence::test::print_runtime(cri, opt.endpoint, "gpufence-test-cluster", std::cout))
    return 1;

  // Step 2: the API server with the cluster's objects, and a kubeconfig naming it.
  TestApiServer api;
  api.require_token(opt.token);
  Cluster cluster(opt, kubelet, cri, api);
  cluster.publish();
  if (auto st = gpufence::write_file_atomic(opt.kubeconfig, api.kubeconfig(opt.token),
                                            gpufence::Durability::none);
      !st) {
    std::cerr << "gpufence-test-cluster: " << st.error().message << "\n";
    return 1;
  }
  std::cout << "api " << api.url() << std::endl;

  // Step 3: the controllers, scheduler and kubelet act on what clients change, until stopped.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opt.limit_s);
  while (!stop->stop_requested() && access(opt.stop_file.c_str(), F_OK) != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    cluster.step();
    stop->wait_for(std::chrono::milliseconds(50));
  }

  // Step 4: stop and remove every pod, as the kubelet does when they are deleted.
  int failed = cluster.teardown();
  kubelet.stop();
  return failed == 0 ? 0 : 1;
}
