#include "doctor/gather.hpp"

#include <sys/stat.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/in_root.hpp"
#include "common/strings.hpp"
#include "containerd/config.hpp"
#include "doctor/checks.hpp"
#include "doctor/parse.hpp"
#include "doctor/process_dir.hpp"
#include "kube/client.hpp"
#include "kube/pod_request.hpp"
#include "kube/quantity.hpp"
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
  struct stat st {};
  v.socket_present = ::stat(host.resolve(v.socket_path).c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
  if (auto text = host.read(opt.install_state)) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_object()) {
      v.state_file = opt.install_state;
      v.enforcement = j.value("enforcement", std::string("runtime"));
    }
  }
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
    // As the scheduler counts it (init containers, sidecars, overhead): the one answer kube/ has.
    auto gpus = effective_request(spec, resource_name);
    if (!gpus)
      return std::unexpected(gpus.error().wrap("pod " + pod.pod_namespace + "/" + pod.name));
    pod.gpus = *gpus;
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

Snapshot gather_snapshot(const HostFs& host, GpuInventory* inventory,
                         const std::string& inventory_error, const GatherOptions& options,
                         KubeClient* kube, const std::string& kube_error,
                         const std::string& node_name) {
  Snapshot s;
  GatherOptions opt = options;
  s.resource_name = opt.resource_name;

  // The API server's view first: the RuntimeClasses GPU pods use are the handlers to check.
  if (kube) {
    auto view = read_kube_view(*kube, node_name, opt.resource_name);
    if (view) {
      for (const auto& pod : view->pods) {
        if (pod.gpus <= 0 || pod.runtime_class.empty()) continue;
        auto rc = view->runtime_classes.find(pod.runtime_class);
        if (rc == view->runtime_classes.end()) continue;
        if (std::find(opt.handlers.begin(), opt.handlers.end(), rc->second) == opt.handlers.end()) {
          opt.handlers.push_back(rc->second);
        }
      }
      s.kube = std::move(*view);
    } else {
      s.skipped.push_back("Kubernetes API: " + view.error().message);
    }
  } else {
    s.skipped.push_back("Kubernetes API: " +
                        (kube_error.empty()
                             ? std::string("not asked (--kubeconfig or --in-cluster)")
                             : kube_error));
  }

  // GPUs and their processes.
  if (!inventory) {
    s.skipped.push_back("NVML: " + inventory_error);
  } else if (auto gpus = inventory->gpus()) {
    for (auto& g : *gpus) {
      NodeGpu ng{g, {}};
      if (auto procs = inventory->processes(g.uuid))
        ng.processes = std::move(*procs);
      else
        s.skipped.push_back(cat("NVML processes of ", g.uuid, ": ", procs.error().message));
      s.gpus.push_back(std::move(ng));
    }
  } else {
    s.skipped.push_back("NVML: " + gpus.error().message);
  }
  std::set<unsigned> gpu_minors;
  for (const auto& g : s.gpus) gpu_minors.insert(g.gpu.minor);
  if (auto names = host.list("/dev")) {
    for (const auto& n : *names) {
      if (auto m = gpu_node_minor("/dev/" + n)) gpu_minors.insert(*m);
    }
  }

  // Containers, from every process's cgroup.
  s.probed = opt.probe;
  std::map<std::string, NodeContainer> by_id;
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
    auto& c = by_id[*id];
    if (c.id.empty()) c.id = *id;
    c.pids.push_back(pid);
    if (!in_own_devices_cgroup(*cg, *id))
      c.left_cgroup.push_back(cat("pid ", pid, " in devices cgroup ", devices_cgroup(*cg)));
  }
  // The host's PID namespace, as PID 1 sees it: a container whose process shows the same one
  // shares it (hostPID), and can reach every process on the node (docs/trust-model.md).
  std::optional<std::string> host_pid_ns;
  if (auto init = ProcessDir::open(host, 1)) {
    if (auto ns = init->link("ns/pid")) host_pid_ns = *ns;
  }
  // The PID namespace of each process in no container's cgroup, read once: a container's process
  // that left its cgroup shows up here in the container's namespace.
  std::multimap<std::string, std::pair<unsigned, std::string>> outside_by_ns;
  for (const auto& [pid, where] : no_container) {
    auto dir = ProcessDir::open(host, pid);
    if (!dir) continue;  // exited meanwhile
    if (auto ns = dir->link("ns/pid"); ns && (!host_pid_ns || *ns != *host_pid_ns))
      outside_by_ns.emplace(*ns, std::make_pair(pid, where));
  }
  if (auto scope = host.read("/proc/sys/kernel/yama/ptrace_scope"))
    s.ptrace_scope = std::string(trim(*scope));
  for (auto& [id, c] : by_id) {
    // One member, held by its /proc directory and seen in the container through it: its environ,
    // status and root below are that process's even if it exits meanwhile and its pid is reused
    // (doctor/process_dir.hpp).
    std::string cg;
    bool in_own = false;
    auto proc = held_member(host, c, cg, in_own);
    if (!proc) {
      s.skipped.push_back(cat("container ", c.label(), ": every process exited while read"));
      continue;
    }
    unsigned pid = proc->pid();
    if (auto env = proc->read("environ", kMaxEnvironBytes)) {
      auto vars = parse_environ(*env);
      if (vars.contains("NVIDIA_VISIBLE_DEVICES"))
        c.nvidia_visible_devices = vars["NVIDIA_VISIBLE_DEVICES"];
      if (vars.contains("CUDA_VISIBLE_DEVICES"))
        c.cuda_visible_devices = vars["CUDA_VISIBLE_DEVICES"];
    } else if (env.error().code == Errc::invalid_argument) {
      s.skipped.push_back(cat("environment of ", c.label(), ": ", env.error().message));
    }
    if (auto status = proc->read("status")) {
      c.cap_bnd = status_caps(*status, "CapBnd");
      c.cap_eff = status_caps(*status, "CapEff");
      if (c.cap_bnd) c.has_cap_sys_admin = (*c.cap_bnd >> kCapSysAdmin) & 1;
    }
    if (auto ns = proc->link("ns/pid"); ns && host_pid_ns) {
      c.host_pid = *ns == *host_pid_ns;
      // A process of its own PID namespace in no container's cgroup left the container's cgroup
      // (on v2, and on v1 when every controller was moved): it is still the container's.
      auto [first, last] = outside_by_ns.equal_range(*ns);
      for (auto it = first; !*c.host_pid && it != last; ++it)
        c.left_cgroup.push_back(
            cat("pid ", it->second.first, " of its PID namespace in cgroup ", it->second.second));
    }
    if (auto mounts = proc->read("mountinfo")) c.writable_sysfs = writable_sysfs_mounts(*mounts);
    // The container's own files, resolved inside its root: its symlinks are its own
    // (common/in_root.hpp).
    auto root = proc->root();
    if (root) {
      if (auto devs = list_in_root(root->fd, "/dev")) {
        for (const auto& n : *devs) {
          if (auto m = gpu_node_minor("/dev/" + n)) c.gpu_nodes_present.insert(*m);
        }
      }
    }
    c.bundle = find_bundle(host, id, opt);
    std::string oci_text;
    if (!c.bundle.empty()) {
      if (auto cfg = host.read(c.bundle + "/config.json")) {
        oci_text = *cfg;
        try {
          auto spec = nlohmann::json::parse(*cfg);
          auto ann = spec.value("annotations", nlohmann::json::object());
          c.pod = ann.value("io.kubernetes.cri.sandbox-name", "");
          c.pod_namespace = ann.value("io.kubernetes.cri.sandbox-namespace", "");
          c.name = ann.value("io.kubernetes.cri.container-name", "");
          // A pod's sandbox (pause) container runs the kubelet's infrastructure image, not the
          // pod's code (docs/containerd-lines.md, "Sandboxes"): not a container to judge.
          if (ann.value("io.kubernetes.cri.container-type", "") == "sandbox") continue;
        } catch (const nlohmann::json::exception&) {
        }
      }
    }
    // Which GPUs its cgroup lets it open.
    auto v1 = cgroup_path(cg, "devices");
    if (!in_own) {
      // Every process left the container's devices cgroup: the one they are in is not the
      // container's, and neither its rules nor the OCI spec's say what they can open.
      s.skipped.push_back(cat("devices cgroup of ", c.label(),
                              ": every process left it (gpu.left-devices-cgroup); what it can "
                              "open is not read from any rules"));
      oci_text.clear();
      v1.reset();
    }
    if (auto own = v1 ? v1 : cgroup_path(cg, ""); own && has_dot_dot(*own)) {
      // Seen from another cgroup namespace ("/../.."): the path names no cgroup under
      // /sys/fs/cgroup, so it is neither probed nor read there (docs/trust-model.md).
      s.skipped.push_back(cat("cgroup of ", c.label(), " is ", *own,
                              ", outside the doctor's cgroup namespace: not probed or read "
                              "(run the doctor privileged, as deploy/kubernetes/doctor-job.yaml "
                              "does, for the host's)"));
      v1.reset();
    } else if (opt.probe && in_own) {
      std::string procs =
          v1 ? cat("/sys/fs/cgroup/devices", *v1, "/cgroup.procs")
             : cat("/sys/fs/cgroup", cgroup_path(cg, "").value_or("/"), "/cgroup.procs");
      auto probed = probe_gpu_access(host, pid, host.resolve(procs).string(), gpu_minors);
      if (probed) {
        c.openable = *probed;
        c.openable_source = "probe";
      } else {
        s.skipped.push_back(cat("probe of ", c.label(), ": ", probed.error().message));
      }
    }
    if (!c.openable && v1) {
      if (auto list = host.read(cat("/sys/fs/cgroup/devices", *v1, "/devices.list"))) {
        if (auto minors = openable_gpu_minors_from_devices_list(*list, gpu_minors)) {
          c.openable = *minors;
          c.openable_source = "devices.list";
        }
      }
    }
    if (!c.openable && !oci_text.empty()) {
      // v1 shows only "a *:* rwm" once a spec starts with allow-all, and v2 has no list at all:
      // replay the rules the runtime was given instead.
      c.openable = openable_gpu_minors_from_oci_rules(oci_text, gpu_minors);
      c.openable_source = "oci-spec rules";
    }
    for (const auto& path : opt.app_configs) {
      if (!root) break;
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
    s.containers.push_back(std::move(c));
  }

  // The kubelet's view.
  std::string why;
  for (const auto& sock : opt.pod_resources_sockets) {
    if (!host.exists(sock)) continue;
    auto view = read_pod_resources(host.resolve(sock).string(), opt.resource_name);
    if (view) {
      s.allocations = view->allocations;
      s.allocatable = view->allocatable;
      break;
    }
    why = view.error().message;
  }
  if (!s.allocations) {
    s.skipped.push_back(
        "kubelet: " +
        (why.empty() ? "no PodResources socket at " + join(opt.pod_resources_sockets, ", ") : why) +
        "; allocation checks skipped");
  } else {
    std::vector<std::string> unknown;
    for (const auto& c : s.containers)
      if (!in_kubelet_view(s, c)) unknown.push_back(c.label());
    if (!unknown.empty())
      s.skipped.push_back(cat(unknown.size(),
                              " container(s) the kubelet's PodResources does not name (another "
                              "runtime's, another kubelet's, or made by hand): not judged: ",
                              join(unknown, ", ")));
  }

  for (const auto& dir : opt.plugin_dirs) {
    auto names = host.list(dir);
    if (!names) continue;
    // The kubelet's stored Allocate answers, which it replays (checks: gpu.checkpoint-renumbered).
    if (s.checkpoint_path.empty() &&
        std::find(names->begin(), names->end(), "kubelet_internal_checkpoint") != names->end()) {
      std::string path = dir + "/kubelet_internal_checkpoint";
      auto text = host.read(path);
      auto entries = text
                         ? parse_kubelet_checkpoint(*text, opt.resource_name)
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
  gather_containerd(s, host, opt);
  return s;
}

}  // namespace gpufence
