#include "doctor/gather.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/escape.hpp"
#include "common/in_root.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "containerd/config.hpp"
#include "doctor/checks.hpp"
#include "doctor/parse.hpp"
#include "doctor/process_dir.hpp"
#include "kube/client.hpp"
#include "kube/pod_request.hpp"
#include "kube/quantity.hpp"
#include "runtime/cdi_edits.hpp"
#include "runtime/config.hpp"
#include "runtime/isolation.hpp"

namespace gpufence {
namespace {

// The bundle directory of a container: containerd's task dir, else a runc state's label.
std::string find_bundle(const HostFs& host, const std::string& id, const GatherOptions& opt) {
  for (const auto& dir : opt.task_dirs) {
    auto namespaces = host.list(dir);
    if (!namespaces) continue;
    for (const auto& ns : *namespaces) {
      std::string bundle = cat(dir, "/", ns, "/", id);
      if (host.exists(bundle + "/config.json")) return bundle;
    }
  }
  auto bundle_label = [&](const std::string& state_path) -> std::string {
    auto text = host.read(state_path);
    if (!text) return "";
    try {
      auto state = nlohmann::json::parse(*text);
      // runc turns every OCI annotation into a "key=value" label and appends its own
      // "bundle=<dir>" last (measured with runc 1.1.5): an annotation "bundle" that a pod passes
      // through would otherwise name a bundle of its choosing (docs/trust-model.md).
      std::string bundle;
      for (const auto& label : state.at("config").value("labels", nlohmann::json::array())) {
        std::string l = label.get<std::string>();
        if (l.starts_with("bundle=")) bundle = l.substr(7);
      }
      return bundle;
    } catch (const nlohmann::json::exception&) {
    }
    return "";
  };
  for (const auto& root : opt.runc_roots) {
    if (auto b = bundle_label(cat(root, "/", id, "/state.json")); !b.empty()) return b;
    auto namespaces = host.list(root);
    if (!namespaces) continue;
    for (const auto& ns : *namespaces) {
      if (auto b = bundle_label(cat(root, "/", ns, "/", id, "/state.json")); !b.empty()) return b;
    }
  }
  return "";
}

bool has_dot_dot(std::string_view path) {
  for (std::string_view part : split(path, '/'))
    if (part == "..") return true;
  return false;
}

// The cgroup that holds a process's devices access: the v1 devices controller's, else the v2
// unified one ("" when the text names neither).
std::string devices_cgroup(std::string_view proc_cgroup) {
  if (auto v1 = cgroup_path(proc_cgroup, "devices")) return *v1;
  return cgroup_path(proc_cgroup, "").value_or("");
}

// Whether a process of container `id` still sits in that container's devices cgroup (or one below
// it). A process with CAP_SYS_ADMIN and a writable cgroupfs can write its pid into another
// cgroup's cgroup.procs, e.g. the root devices cgroup that allows every device; its other v1
// controllers' lines still name the container.
bool in_own_devices_cgroup(std::string_view proc_cgroup, const std::string& id) {
  return devices_cgroup(proc_cgroup).find(id) != std::string::npos;
}

// The first of the container's processes that is still running and, read through its held /proc
// directory, still in the container and in its own devices cgroup; `cgroup` gets its
// /proc/<pid>/cgroup. Only when every member has left its devices cgroup is one of those taken
// (`in_own` false then): its cgroup's rules are not the container's.
std::optional<ProcessDir> held_member(const HostFs& host, const NodeContainer& c,
                                      std::string& cgroup, bool& in_own) {
  std::optional<ProcessDir> outside;
  std::string outside_cgroup;
  for (unsigned pid : c.pids) {
    auto proc = ProcessDir::open(host, pid);
    if (!proc) continue;
    auto text = proc->read("cgroup");
    if (!text || container_id_from_cgroup(*text) != c.id) continue;
    if (!in_own_devices_cgroup(*text, c.id)) {
      if (!outside) {
        outside = std::move(proc);
        outside_cgroup = std::move(*text);
      }
      continue;
    }
    cgroup = std::move(*text);
    in_own = true;
    return proc;
  }
  cgroup = std::move(outside_cgroup);
  in_own = false;
  return outside;
}

std::vector<unsigned> numeric_pids(const HostFs& host) {
  std::vector<unsigned> pids;
  auto entries = host.list("/proc");
  if (!entries) return pids;
  for (const auto& e : *entries) {
    if (auto pid = parse_number<unsigned>(e)) pids.push_back(*pid);
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

// gpufence-nri's status file, and whether the process it names is still that process (a pid
// with another start time is a reused pid: the plugin is gone).
void gather_nri_status(NriView& v, const HostFs& host, const std::string& path) {
  v.status_file = path;
  auto text = host.read(path);
  if (!text) {
    v.status_error = text.error().code == Errc::not_found ? cat("no status file at ", path)
                                                          : text.error().message;
    return;
  }
  auto status = nri::parse_nri_status(*text, path);
  if (!status) {
    v.status_error = status.error().message;
    return;
  }
  v.status = *status;
  if (status->state == nri::NriState::connected)
    if (auto since = parse_utc_rfc3339(status->since))
      v.connected_for_s = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now() - *since)
                              .count();
  auto stat = host.read(cat("/proc/", status->pid, "/stat"));
  if (!stat) {
    v.plugin_process =
        stat.error().code == Errc::not_found ? NriView::Process::gone : NriView::Process::unknown;
    return;
  }
  auto start = nri::parse_proc_start_time(*stat);
  if (!start) return;
  v.plugin_process =
      *start == status->start_time ? NriView::Process::running : NriView::Process::gone;
}

// Whether `path` is a regular file, or a chain of links (40 at most, as the kernel follows)
// ending at one: a dangling plugin link is no plugin.
bool leads_to_file(const HostFs& host, std::string path) {
  for (int hops = 0; hops <= 40; ++hops) {
    auto info = host.stat(path);
    if (!info) return false;
    if (info->type != FileType::symlink) return info->type == FileType::regular;
    auto target = host.read_link(path);
    if (!target) return false;
    path = target->starts_with("/")
               ? *target
               : (std::filesystem::path(path).parent_path() / *target).lexically_normal().string();
  }
  return false;
}

// NRI in the config containerd reads, its socket, and the mode install recorded.
NriView gather_nri(const HostFs& host, const ContainerdConfig& effective,
                   const GatherOptions& opt) {
  NriView v;
  v.plugin_name = opt.nri_plugin_name;
  auto settings = nri_settings(effective);
  v.enabled = settings.enabled;
  v.socket_path = settings.socket_path;
  v.validator_enabled = settings.validator_enabled;
  v.required_plugins = settings.required_plugins;
  v.tolerate_annotation = settings.tolerate_annotation;
  // Through a directory opened in the host's root: the host's absolute links (/var/run -> /run)
  // lead to the host's files, not this pod's (a plain resolve() would name /host/var/run).
  struct stat st {};
  auto socket = host.socket_path(v.socket_path);
  v.socket_present = socket && ::stat(socket->path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  // The fence's link in plugin_path (containerd's default /opt/nri/plugins, or the config's).
  std::string plugin_path = "/opt/nri/plugins";
  if (const auto* nri = effective.doc["plugins"][kNriPlugin].as_table())
    if (auto p = nri->get_as<std::string>("plugin_path"); p && !p->get().empty())
      plugin_path = p->get();
  v.fence_name = opt.nri_fence_name;
  v.fence_link = cat(plugin_path, "/", opt.nri_fence_index, "-", opt.nri_fence_name);
  if (auto text = host.read(opt.install_state)) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object()) {
      v.state_file = opt.install_state;
      v.enforcement = j.value("enforcement", std::string("runtime"));
      auto plugin = j.value("nriPlugin", nlohmann::json::object());
      if (plugin.is_object() && plugin.value("fenceLink", nlohmann::json()).is_string())
        v.fence_link = plugin["fenceLink"].get<std::string>();
    }
  }
  v.fence_link_present = leads_to_file(host, v.fence_link);
  gather_nri_status(v, host, opt.nri_status);
  return v;
}

void gather_containerd(Snapshot& s, const HostFs& host, const GatherOptions& opt) {
  for (const auto& path : opt.containerd_configs) {
    auto text = host.read(path);
    if (!text) continue;
    auto cfg = parse_containerd_config(*text, path);
    if (!cfg) {
      s.containerd_findings.push_back(
          {"containerd.config-unreadable", Severity::error, "containerd's config does not parse",
           cfg.error().message, "fix the syntax error; containerd itself will refuse this file"});
      s.containerd_config = path;
      return;
    }
    auto merged = merge_imports_from_host(*cfg, host);
    const ContainerdConfig& effective = merged ? *merged : *cfg;
    s.cdi_specs =
        summarize_cdi_spec_files(read_cdi_spec_files(host, cdi_settings(effective).spec_dirs));
    ContainerdCheckOptions copt{opt.handlers, &host, true};
    s.containerd_findings = check_containerd_config(effective, copt);
    s.containerd_config = path;
    s.nri = gather_nri(host, effective, opt);
    if (!s.nri->tolerate_annotation.empty() && !s.kube)
      s.skipped.push_back(cat("pods carrying the NRI waiver annotation ",
                              s.nri->tolerate_annotation,
                              ": not checked without the Kubernetes API"));
    std::string def = default_runtime_name(effective);
    s.containerd_default_runtime = def;
    for (const auto& r : cri_runtimes(effective)) {
      s.containerd_binaries[r.name] = r.binary_name.value_or("");
      if (r.name == def && r.binary_name) s.containerd_default_binary = *r.binary_name;
    }
    return;
  }
  // No file: containerd runs on built-in defaults, which have no GPU handler.
  s.cdi_specs = summarize_cdi_spec_files(read_cdi_spec_files(host, CdiSettings{}.spec_dirs));
  ContainerdConfig defaults;
  defaults.path = "(no containerd config file: built-in defaults)";
  defaults.version = 2;
  s.containerd_findings = check_containerd_config(defaults, {opt.handlers, nullptr, true});
  s.skipped.push_back("containerd: no config file at " + join(opt.containerd_configs, ", ") +
                      "; judged containerd's defaults");
}

// A member of a JSON object; null when `object` is not one or has no such member (the API's
// objects are read, never trusted to have the shape the schema says).
const nlohmann::json& member(const nlohmann::json& object, const char* key) {
  static const nlohmann::json null;
  if (!object.is_object()) return null;
  auto it = object.find(key);
  return it == object.end() ? null : *it;
}

// A string member, "" when absent or of another type.
std::string text_of(const nlohmann::json& object, const char* key) {
  const auto& v = member(object, key);
  return v.is_string() ? v.get<std::string>() : "";
}

// What the API says about the pod's life: uid, phase, since when the kubelet has it, what its
// containers wait for, and its controlling DaemonSet.
void read_pod_lifecycle(const nlohmann::json& p, KubePod& pod) {
  const auto& meta = member(p, "metadata");
  const auto& status = member(p, "status");
  pod.uid = text_of(meta, "uid");
  pod.phase = text_of(status, "phase");
  if (auto t = parse_utc_rfc3339(text_of(status, "startTime")))
    pod.started = *t;
  else if (auto c = parse_utc_rfc3339(text_of(meta, "creationTimestamp")))
    pod.started = *c;
  for (const char* list : {"initContainerStatuses", "containerStatuses"}) {
    const auto& statuses = member(status, list);
    if (!statuses.is_array()) continue;
    for (const auto& cs : statuses) {
      const auto& waiting = member(member(cs, "state"), "waiting");
      if (waiting.is_object())
        pod.waiting.push_back(cat(text_of(cs, "name"), ": ", text_of(waiting, "reason")));
    }
  }
  const auto& owners = member(meta, "ownerReferences");
  if (!owners.is_array()) return;
  for (const auto& o : owners) {
    const auto& controller = member(o, "controller");
    if (!controller.is_boolean() || !controller.get<bool>()) continue;
    if (text_of(o, "kind") == "DaemonSet" && text_of(o, "apiVersion").starts_with("apps/"))
      pod.daemonset = text_of(o, "name");
  }
}

}  // namespace

Result<KubeView> read_kube_view(KubeClient& kube, const std::string& node_name,
                                const std::string& resource_name) {
  KubeView view;
  auto node = kube.get("/api/v1/nodes/" + node_name);
  if (!node) return std::unexpected(node.error());
  const auto status = node->value("status", nlohmann::json::object());
  // A quantity the API cannot have written is an error naming where it was, never a 0.
  auto capacity = resource_count(status.value("capacity", nlohmann::json::object()), resource_name);
  if (!capacity) return std::unexpected(capacity.error().wrap("node " + node_name + " capacity"));
  auto allocatable =
      resource_count(status.value("allocatable", nlohmann::json::object()), resource_name);
  if (!allocatable)
    return std::unexpected(allocatable.error().wrap("node " + node_name + " allocatable"));
  view.capacity = *capacity;
  view.allocatable = *allocatable;
  // DRA: the node's slices (a cluster without resource.k8s.io/v1, or a doctor whose RBAC
  // predates it, answers 404/403: no DRA devices known).
  auto slices = kube.call("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=" +
                                     url_escape("spec.nodeName=" + node_name));
  if (slices && slices->status == 200 && slices->body.is_object()) {
    for (const auto& sl : slices->body.value("items", nlohmann::json::array())) {
      if (!sl.is_object()) continue;
      const auto spec = sl.value("spec", nlohmann::json::object());
      if (!spec.is_object()) continue;
      const auto devices = spec.value("devices", nlohmann::json::array());
      if (devices.is_array())
        view.dra_devices[spec.value("driver", "")] += static_cast<long>(devices.size());
    }
  }
  auto classes = kube.get("/apis/node.k8s.io/v1/runtimeclasses");
  if (!classes) return std::unexpected(classes.error());
  for (const auto& rc : classes->value("items", nlohmann::json::array())) {
    view.runtime_classes[rc.value("metadata", nlohmann::json::object()).value("name", "")] =
        rc.value("handler", "");
  }
  auto pods = kube.get("/api/v1/pods?fieldSelector=spec.nodeName%3D" + node_name);
  if (!pods) return std::unexpected(pods.error());
  for (const auto& p : pods->value("items", nlohmann::json::array())) {
    KubePod pod;
    auto meta = p.value("metadata", nlohmann::json::object());
    auto spec = p.value("spec", nlohmann::json::object());
    pod.pod_namespace = meta.value("namespace", "");
    pod.name = meta.value("name", "");
    pod.runtime_class = spec.value("runtimeClassName", "");
    const auto annotations = meta.value("annotations", nlohmann::json::object());
    if (annotations.is_object())
      for (const auto& [key, value] : annotations.items())
        if (value.is_string()) pod.annotations[key] = value.get<std::string>();
    // As the scheduler counts it (init containers, sidecars, overhead): the one answer kube/ has.
    auto gpus = effective_request(spec, resource_name);
    if (!gpus)
      return std::unexpected(gpus.error().wrap("pod " + pod.pod_namespace + "/" + pod.name));
    pod.gpus = *gpus;
    read_pod_lifecycle(p, pod);
    for (const auto& c : spec.value("containers", nlohmann::json::array())) {
      if (c.value("securityContext", nlohmann::json::object()).value("privileged", false))
        pod.privileged = true;
      for (const auto& e : c.value("env", nlohmann::json::array())) {
        if (e.value("name", "") == "NVIDIA_VISIBLE_DEVICES") {
          pod.env_visible_devices.push_back(c.value("name", "") + ": " + e.value("value", ""));
        }
      }
    }
    view.pods.push_back(std::move(pod));
  }
  return view;
}

namespace {

// One gathering: what every step reads, and the snapshot the steps fill in order (the order of
// `snap.skipped` is the report's).
struct GatherContext {
  const HostFs& host;
  GatherOptions opt;  // handlers grow by the RuntimeClasses GPU pods name (read_api_view)
  const GatherSources& sources;
  Snapshot snap;
  std::set<unsigned> gpu_minors;  // every GPU minor NVML or the host's /dev names
};

// 1. The API server's view first: the RuntimeClasses GPU pods use are the handlers to check.
void read_api_view(GatherContext& ctx) {
  if (!ctx.sources.kube) {
    ctx.snap.skipped.push_back("Kubernetes API: " + ctx.sources.kube.error().message);
    return;
  }
  auto view = read_kube_view(ctx.sources.kube->get(), ctx.sources.node_name, ctx.opt.resource_name);
  if (!view) {
    ctx.snap.skipped.push_back("Kubernetes API: " + view.error().message);
    return;
  }
  auto& handlers = ctx.opt.handlers;
  for (const auto& pod : view->pods) {
    if (pod.gpus <= 0 || pod.runtime_class.empty()) continue;
    auto rc = view->runtime_classes.find(pod.runtime_class);
    if (rc == view->runtime_classes.end()) continue;
    if (std::find(handlers.begin(), handlers.end(), rc->second) == handlers.end())
      handlers.push_back(rc->second);
  }
  ctx.snap.kube = std::move(*view);
}

// 2. The GPUs and the processes NVML sees on each.
void read_gpus(GatherContext& ctx) {
  if (!ctx.sources.inventory) {
    ctx.snap.skipped.push_back("NVML: " + ctx.sources.inventory.error().message);
    return;
  }
  GpuInventory& inventory = ctx.sources.inventory->get();
  auto gpus = inventory.gpus();
  if (!gpus) {
    ctx.snap.skipped.push_back("NVML: " + gpus.error().message);
    return;
  }
  for (auto& g : *gpus) {
    NodeGpu ng{g, {}};
    if (auto procs = inventory.processes(g.uuid))
      ng.processes = std::move(*procs);
    else
      ctx.snap.skipped.push_back(cat("NVML processes of ", g.uuid, ": ", procs.error().message));
    ctx.snap.gpus.push_back(std::move(ng));
  }
}

// 3. The GPU minors to judge access to: NVML's, and every /dev/nvidiaN the host has (a GPU NVML
//    does not list can still be opened).
void list_gpu_minors(GatherContext& ctx) {
  for (const auto& g : ctx.snap.gpus) ctx.gpu_minors.insert(g.gpu.minor);
  if (auto names = ctx.host.list("/dev")) {
    for (const auto& n : *names) {
      if (auto m = gpu_node_minor("/dev/" + n)) ctx.gpu_minors.insert(*m);
    }
  }
}

// Every process sorted into its container by its cgroup, and what the others say about PID
// namespaces.
struct ProcessCensus {
  std::map<std::string, NodeContainer> by_id;
  // The host's PID namespace, as PID 1 sees it: a container whose process shows the same one
  // shares it (hostPID), and can reach every process on the node (docs/trust-model.md).
  std::optional<std::string> host_pid_ns;
  // The PID namespace of each process in no container's cgroup -> (pid, its devices cgroup): a
  // container's process that left its cgroup shows up here in the container's namespace.
  std::multimap<std::string, std::pair<unsigned, std::string>> outside_by_ns;
};

ProcessCensus take_process_census(const HostFs& host) {
  ProcessCensus census;
  std::vector<std::pair<unsigned, std::string>> no_container;  // pid, its devices cgroup
  for (unsigned pid : numeric_pids(host)) {
    auto proc = ProcessDir::open(host, pid);
    if (!proc) continue;  // vanished
    auto cg = proc->read("cgroup");
    if (!cg) continue;  // vanished, or not ours to read
    auto id = container_id_from_cgroup(*cg);
    if (!id) {
      no_container.emplace_back(pid, devices_cgroup(*cg));
      continue;
    }
    auto& c = census.by_id[*id];
    if (c.id.empty()) c.id = *id;
    c.pids.push_back(pid);
    if (!in_own_devices_cgroup(*cg, *id))
      c.left_cgroup.push_back(cat("pid ", pid, " in devices cgroup ", devices_cgroup(*cg)));
  }
  if (auto init = ProcessDir::open(host, 1)) {
    if (auto ns = init->link("ns/pid")) census.host_pid_ns = *ns;
  }
  // Read once, for every container.
  for (const auto& [pid, where] : no_container) {
    auto dir = ProcessDir::open(host, pid);
    if (!dir) continue;  // exited meanwhile
    if (auto ns = dir->link("ns/pid"); ns && (!census.host_pid_ns || *ns != *census.host_pid_ns))
      census.outside_by_ns.emplace(*ns, std::make_pair(pid, where));
  }
  return census;
}

// What the held member's /proc says: environment, capabilities, PID namespace, mounts, and the
// GPU nodes in the container's own /dev.
void read_member_facts(GatherContext& ctx, const ProcessCensus& census, const ProcessDir& proc,
                       const Result<Fd>& root, NodeContainer& c) {
  if (auto env = proc.read("environ", kMaxEnvironBytes)) {
    auto vars = parse_environ(*env);
    if (vars.contains("NVIDIA_VISIBLE_DEVICES"))
      c.nvidia_visible_devices = vars["NVIDIA_VISIBLE_DEVICES"];
    if (vars.contains("CUDA_VISIBLE_DEVICES"))
      c.cuda_visible_devices = vars["CUDA_VISIBLE_DEVICES"];
  } else if (env.error().code == Errc::invalid_argument) {
    ctx.snap.skipped.push_back(cat("environment of ", c.label(), ": ", env.error().message));
  }
  if (auto status = proc.read("status")) {
    c.cap_bnd = status_caps(*status, "CapBnd");
    c.cap_eff = status_caps(*status, "CapEff");
    if (c.cap_bnd) c.has_cap_sys_admin = (*c.cap_bnd >> kCapSysAdmin) & 1;
  }
  if (auto ns = proc.link("ns/pid"); ns && census.host_pid_ns) {
    c.host_pid = *ns == *census.host_pid_ns;
    // A process of its own PID namespace in no container's cgroup left the container's cgroup
    // (on v2, and on v1 when every controller was moved): it is still the container's.
    auto [first, last] = census.outside_by_ns.equal_range(*ns);
    for (auto it = first; !*c.host_pid && it != last; ++it)
      c.left_cgroup.push_back(
          cat("pid ", it->second.first, " of its PID namespace in cgroup ", it->second.second));
  }
  if (auto mounts = proc.read("mountinfo")) c.writable_sysfs = writable_sysfs_mounts(*mounts);
  // The container's own files, resolved inside its root: its symlinks are its own
  // (common/in_root.hpp).
  if (root) {
    if (auto devs = list_in_root(root->fd, "/dev")) {
      for (const auto& n : *devs) {
        if (auto m = gpu_node_minor("/dev/" + n)) c.gpu_nodes_present.insert(*m);
      }
    }
  }
}

// The container's OCI bundle: its pod and name from the CRI annotations, and the spec's text
// (its cgroup rules are the last word on what it may open). A pod's sandbox (pause) container
// runs the kubelet's infrastructure image, not the pod's code (docs/containerd-lines.md,
// "Sandboxes"): not a container to judge.
enum class BundleKind { container, sandbox };
BundleKind read_bundle(const GatherContext& ctx, NodeContainer& c, std::string& oci_text) {
  c.bundle = find_bundle(ctx.host, c.id, ctx.opt);
  if (c.bundle.empty()) return BundleKind::container;
  auto cfg = ctx.host.read(c.bundle + "/config.json");
  if (!cfg) return BundleKind::container;
  oci_text = *cfg;
  try {
    auto spec = nlohmann::json::parse(*cfg);
    auto ann = spec.value("annotations", nlohmann::json::object());
    c.pod = ann.value("io.kubernetes.cri.sandbox-name", "");
    c.pod_namespace = ann.value("io.kubernetes.cri.sandbox-namespace", "");
    c.name = ann.value("io.kubernetes.cri.container-name", "");
    if (ann.value("io.kubernetes.cri.container-type", "") == "sandbox") return BundleKind::sandbox;
  } catch (const nlohmann::json::exception&) {
  }
  return BundleKind::container;
}

// Which GPUs its cgroup lets it open: the probe's measurement, else the v1 devices.list, else
// the rules the runtime was given.
void read_openable(GatherContext& ctx, unsigned pid, const std::string& cg, bool in_own,
                   std::string oci_text, NodeContainer& c) {
  auto& skipped = ctx.snap.skipped;
  auto v1 = cgroup_path(cg, "devices");
  if (!in_own) {
    // Every process left the container's devices cgroup: the one they are in is not the
    // container's, and neither its rules nor the OCI spec's say what they can open.
    skipped.push_back(cat("devices cgroup of ", c.label(),
                          ": every process left it (gpu.left-devices-cgroup); what it can "
                          "open is not read from any rules"));
    oci_text.clear();
    v1.reset();
  }
  if (auto own = v1 ? v1 : cgroup_path(cg, ""); own && has_dot_dot(*own)) {
    // Seen from another cgroup namespace ("/../.."): the path names no cgroup under
    // /sys/fs/cgroup, so it is neither probed nor read there (docs/trust-model.md).
    skipped.push_back(cat("cgroup of ", c.label(), " is ", *own,
                          ", outside the doctor's cgroup namespace: not probed or read "
                          "(run the doctor privileged, as deploy/kubernetes/doctor-job.yaml "
                          "does, for the host's)"));
    v1.reset();
  } else if (ctx.opt.probe && in_own) {
    std::string procs =
        v1 ? cat("/sys/fs/cgroup/devices", *v1, "/cgroup.procs")
           : cat("/sys/fs/cgroup", cgroup_path(cg, "").value_or("/"), "/cgroup.procs");
    auto probed = probe_gpu_access(ctx.host, pid, ctx.host.resolve(procs).string(), ctx.gpu_minors);
    if (probed) {
      c.openable = *probed;
      c.openable_source = "probe";
    } else {
      skipped.push_back(cat("probe of ", c.label(), ": ", probed.error().message));
    }
  }
  if (!c.openable && v1) {
    if (auto list = ctx.host.read(cat("/sys/fs/cgroup/devices", *v1, "/devices.list"))) {
      if (auto minors = openable_gpu_minors_from_devices_list(*list, ctx.gpu_minors)) {
        c.openable = *minors;
        c.openable_source = "devices.list";
      }
    }
  }
  if (!c.openable && !oci_text.empty()) {
    // v1 shows only "a *:* rwm" once a spec starts with allow-all, and v2 has no list at all:
    // replay the rules the runtime was given instead.
    c.openable = openable_gpu_minors_from_oci_rules(oci_text, ctx.gpu_minors);
    c.openable_source = "oci-spec rules";
  }
}

// The gpu-id keys of the DeepStream configs asked for (--app-config), read inside its root.
void read_app_gpu_ids(const GatherContext& ctx, const Result<Fd>& root, NodeContainer& c) {
  if (!root) return;
  for (const auto& path : ctx.opt.app_configs) {
    auto text = read_regular_in_root(root->fd, path);
    if (!text) continue;
    // Each value once: the file is the container's, and 1 MiB of one "gpu-id=7" line repeated
    // must make one finding, not a hundred thousand that bury the rest.
    std::vector<int> ids;
    std::set<int> seen;
    for (const auto& k : deepstream_gpu_ids(*text))
      if (seen.insert(k.gpu_id).second) ids.push_back(k.gpu_id);
    if (!ids.empty()) c.app_gpu_ids[path] = ids;
  }
}

// 4. The containers, from every process's cgroup, each seen through one held member.
void read_containers(GatherContext& ctx) {
  ctx.snap.probed = ctx.opt.probe;
  ProcessCensus census = take_process_census(ctx.host);
  if (auto scope = ctx.host.read("/proc/sys/kernel/yama/ptrace_scope"))
    ctx.snap.ptrace_scope = std::string(trim(*scope));
  for (auto& [id, c] : census.by_id) {
    // One member, held by its /proc directory and seen in the container through it: its environ,
    // status and root below are that process's even if it exits meanwhile and its pid is reused
    // (doctor/process_dir.hpp).
    std::string cg;
    bool in_own = false;
    auto proc = held_member(ctx.host, c, cg, in_own);
    if (!proc) {
      ctx.snap.skipped.push_back(cat("container ", c.label(), ": every process exited while read"));
      continue;
    }
    auto root = proc->root();
    read_member_facts(ctx, census, *proc, root, c);
    std::string oci_text;
    if (read_bundle(ctx, c, oci_text) == BundleKind::sandbox) continue;
    read_openable(ctx, proc->pid(), cg, in_own, std::move(oci_text), c);
    read_app_gpu_ids(ctx, root, c);
    ctx.snap.containers.push_back(std::move(c));
  }
}

// 5. The kubelet's view through PodResources: what it allocated to which container. The first
//    socket that answers; without one, the allocation checks have nothing to compare.
void read_kubelet_view(GatherContext& ctx) {
  std::string why;
  for (const auto& sock : ctx.opt.pod_resources_sockets) {
    if (!ctx.host.exists(sock)) continue;
    auto view =
        ctx.sources.read_pod_resources(ctx.host.resolve(sock).string(), ctx.opt.resource_name);
    if (view) {
      ctx.snap.allocations = std::move(view->allocations);
      ctx.snap.allocatable = std::move(view->allocatable);
      break;
    }
    why = view.error().message;
  }
  if (!ctx.snap.allocations) {
    ctx.snap.skipped.push_back(
        "kubelet: " +
        (why.empty() ? "no PodResources socket at " + join(ctx.opt.pod_resources_sockets, ", ")
                     : why) +
        "; allocation checks skipped");
    return;
  }
  std::vector<std::string> unknown;
  for (const auto& c : ctx.snap.containers)
    if (!in_kubelet_view(ctx.snap, c)) unknown.push_back(c.label());
  if (!unknown.empty())
    ctx.snap.skipped.push_back(cat(unknown.size(),
                                   " container(s) the kubelet's PodResources does not name "
                                   "(another runtime's, another kubelet's, or made by hand): not "
                                   "judged: ",
                                   join(unknown, ", ")));
  if (ctx.snap.kube) return;
  // pod.gpu-held-without-container counts a pod's age from the API server.
  std::set<std::string> idle;
  for (const auto& a : *ctx.snap.allocations) {
    if (a.device_ids.empty()) continue;
    bool running = std::any_of(ctx.snap.containers.begin(), ctx.snap.containers.end(),
                               [&](const NodeContainer& c) {
                                 return c.pod_namespace == a.pod_namespace && c.pod == a.pod;
                               });
    if (!running) idle.insert(cat(a.pod_namespace, "/", a.pod));
  }
  if (!idle.empty())
    ctx.snap.skipped.push_back(
        cat(idle.size(),
            " pod(s) hold GPUs with no container running; for how long is the API server's to "
            "say (--kubeconfig or --in-cluster), so not judged: ",
            join(std::vector<std::string>(idle.begin(), idle.end()), ", ")));
}

// 5b. Claims of another DRA driver whose kind runtime.toml lists ([cdi] gpu_kinds): the GPUs its
//     CDI specs give, judged by device number as gpufence-nri does (docs/dra.md). A claim that
//     cannot be resolved is named in `skipped`; its GPUs then read as unallocated.
void resolve_listed_cdi_kinds(GatherContext& ctx) {
  if (!ctx.snap.allocations) return;
  auto& allocations = *ctx.snap.allocations;
  if (std::ranges::all_of(allocations,
                          [](const KubeletAllocation& a) { return a.other_cdi_names.empty(); }))
    return;
  auto text = ctx.host.read(ctx.opt.runtime_config);
  if (!text) return;  // no runtime.toml: the defaults list no kind
  auto cfg = parse_runtime_config(*text, ctx.opt.runtime_config);
  if (!cfg) {
    ctx.snap.skipped.push_back(
        cat("another DRA driver's claims not resolved: ", cfg.error().message));
    return;
  }
  if (cfg->gpu_cdi_kinds.empty()) return;
  std::vector<std::string_view> kinds(cfg->gpu_cdi_kinds.begin(), cfg->gpu_cdi_kinds.end());
  auto specs = load_cdi_spec_dirs(ctx.host, cfg->cdi_spec_dirs, kinds);
  if (specs) apply_cdi_priority(specs->specs);
  for (auto& a : allocations) {
    std::vector<std::string> names;
    for (const auto& n : a.other_cdi_names)
      if (cfg->is_listed_gpu_kind(split_cdi_name(n)->kind)) names.push_back(n);
    if (names.empty()) continue;
    auto minors = [&]() -> Result<std::vector<unsigned>> {
      if (!specs) return std::unexpected(specs.error());
      auto selection = select_cdi_devices(specs->specs, names);
      if (!selection) return std::unexpected(selection.error());
      return gpu_minors_of_selection(
          *selection, read_host_device_facts(ctx.host, host_device_query(*selection)));
    }();
    std::string why = minors ? "" : minors.error().message;
    for (unsigned minor : minors.value_or(std::vector<unsigned>{})) {
      auto gpu = std::ranges::find_if(ctx.snap.gpus,
                                      [&](const NodeGpu& g) { return g.gpu.minor == minor; });
      if (gpu == ctx.snap.gpus.end()) {
        why = cat("its spec gives /dev/nvidia", minor, ", which is no GPU of this node");
        continue;
      }
      if (std::ranges::find(a.device_ids, gpu->gpu.uuid) == a.device_ids.end())
        a.device_ids.push_back(gpu->gpu.uuid);
    }
    if (!why.empty())
      ctx.snap.skipped.push_back(cat("kubelet: ", a.pod_namespace, "/", a.pod, " container ",
                                     a.container, ": CDI devices ",
                                     escape_excerpt(join(names, ",")), " not resolved (", why,
                                     "): their GPUs read as unallocated"));
  }
}

// 6. The device plugin directories: the plugins registered there, and the kubelet's stored
//    Allocate answers, which it replays (checks: gpu.checkpoint-renumbered).
void read_device_plugin_dirs(GatherContext& ctx) {
  Snapshot& s = ctx.snap;
  for (const auto& dir : ctx.opt.plugin_dirs) {
    auto names = ctx.host.list(dir);
    if (!names) continue;
    if (s.checkpoint_path.empty() &&
        std::find(names->begin(), names->end(), "kubelet_internal_checkpoint") != names->end()) {
      std::string path = dir + "/kubelet_internal_checkpoint";
      auto text = ctx.host.read(path);
      auto entries = text
                         ? parse_kubelet_checkpoint(*text, ctx.opt.resource_name)
                         : Result<std::vector<CheckpointAllocation>>(std::unexpected(text.error()));
      if (entries) {
        s.checkpoint = std::move(*entries);
        s.checkpoint_path = path;
      } else {
        s.skipped.push_back("kubelet checkpoint " + path + ": " + entries.error().message);
      }
    }
    for (const auto& n : *names) {
      if (n.ends_with(".sock") && n != "kubelet.sock") s.plugin_sockets.push_back(dir + "/" + n);
    }
  }
}

}  // namespace

Snapshot gather_snapshot(const HostFs& host, const GatherOptions& options,
                         const GatherSources& sources) {
  GatherContext ctx{host, options, sources, {}, {}};
  ctx.snap.resource_name = ctx.opt.resource_name;
  ctx.snap.system_namespace = ctx.opt.system_namespace;
  ctx.snap.system_daemonsets = ctx.opt.system_daemonsets;
  ctx.snap.held_after = ctx.opt.held_after;
  ctx.snap.gpu_dra_drivers = ctx.opt.gpu_dra_drivers;
  ctx.snap.taken_at = std::chrono::system_clock::now();
  read_api_view(ctx);
  read_gpus(ctx);
  list_gpu_minors(ctx);
  read_containers(ctx);
  read_kubelet_view(ctx);
  resolve_listed_cdi_kinds(ctx);
  read_device_plugin_dirs(ctx);
  // 7. containerd's config as containerd reads it (imports merged), its CDI specs and NRI; the
  //    handlers judged include those read_api_view added.
  gather_containerd(ctx.snap, ctx.host, ctx.opt);
  return std::move(ctx.snap);
}

}  // namespace gpufence
