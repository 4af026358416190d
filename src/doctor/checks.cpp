#include "doctor/checks.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "common/strings.hpp"
#include "doctor/parse.hpp"
#include "gpu/selector.hpp"

namespace gpufence {

namespace {

// "namespace/name" of the container's pod, "" when unknown: whom a finding is about.
std::string pod_of(const NodeContainer& c) {
  return c.pod.empty() ? std::string() : cat(c.pod_namespace, "/", c.pod);
}

}  // namespace

std::string NodeContainer::label() const {
  if (!pod.empty()) return cat(pod_namespace, "/", pod, "/", name);
  return id.substr(0, 12);
}

namespace {

const NodeGpu* by_minor(const Snapshot& s, unsigned minor) {
  for (const auto& g : s.gpus) {
    if (g.gpu.minor == minor) return &g;
  }
  return nullptr;
}

std::string gpu_names(const Snapshot& s, const std::set<unsigned>& minors) {
  std::vector<std::string> out;
  for (unsigned m : minors) {
    const NodeGpu* g = by_minor(s, m);
    out.push_back(g ? cat("GPU ", g->gpu.index, " (", g->gpu.uuid, ")") : cat("/dev/nvidia", m));
  }
  return out.empty() ? "none" : join(out, ", ");
}

std::vector<Gpu> inventory(const Snapshot& s) {
  std::vector<Gpu> out;
  for (const auto& g : s.gpus) out.push_back(g.gpu);
  return out;
}

std::set<unsigned> minors_of(const std::vector<Gpu>& gpus) {
  std::set<unsigned> out;
  for (const auto& g : gpus) out.insert(g.minor);
  return out;
}

// Which container a PID belongs to.
const NodeContainer* container_of_pid(const Snapshot& s, unsigned pid) {
  for (const auto& c : s.containers) {
    if (std::find(c.pids.begin(), c.pids.end(), pid) != c.pids.end()) return &c;
  }
  return nullptr;
}

std::set<unsigned> used_minors(const Snapshot& s, const NodeContainer& c) {
  std::set<unsigned> out;
  for (const auto& g : s.gpus) {
    for (const auto& p : g.processes) {
      if (container_of_pid(s, p.pid) == &c) out.insert(g.gpu.minor);
    }
  }
  return out;
}

const char* kFixRuntime =
    "run the pod through gpufence-runtime: `gpufence setup containerd --runtime-name nvidia`, then "
    "runtimeClassName: nvidia in the pod spec";

// What a container that ran through gpufence-runtime and can still open GPUs it was not given
// tells: gpufence-runtime denied them in its devices cgroup, so it left that cgroup or can
// rewrite it (docs/trust-model.md, "Privileged containers, honestly").
const char* kFixEscaped =
    "it ran through gpufence-runtime, which denies every GPU not allocated in its devices cgroup: "
    "a container that can open one anyway has left that cgroup or rewritten it, which takes "
    "privileged: true, CAP_SYS_ADMIN or a cgroup filesystem volume; drop those from the pod spec, "
    "enforce Pod Security `baseline` in its namespace, and see docs/trust-model.md (\"What is a "
    "boundary\")";

// Which runtime made a container, as far as the node's own configuration says.
enum class RuntimePath { gpufence, other, unknown };
struct RuntimeSeen {
  RuntimePath path = RuntimePath::unknown;
  std::string evidence;  // how it was told: "RuntimeClass nvidia -> handler nvidia -> ..."
};

// The pod's RuntimeClass handler (the API server's pod spec), else containerd's default
// handler, and that handler's BinaryName in containerd's config. Unknown without the API view or
// when the handler is not in the config read.
RuntimeSeen runtime_of(const Snapshot& s, const NodeContainer& c) {
  if (!s.kube || c.pod.empty()) return {};
  auto pod = std::find_if(s.kube->pods.begin(), s.kube->pods.end(), [&](const KubePod& p) {
    return p.pod_namespace == c.pod_namespace && p.name == c.pod;
  });
  if (pod == s.kube->pods.end()) return {};
  std::string handler = s.containerd_default_runtime, how = "no runtimeClassName";
  if (!pod->runtime_class.empty()) {
    auto rc = s.kube->runtime_classes.find(pod->runtime_class);
    if (rc == s.kube->runtime_classes.end()) return {};
    handler = rc->second;
    how = cat("RuntimeClass ", pod->runtime_class);
  } else {
    how += " (containerd's default)";
  }
  auto bin = s.containerd_binaries.find(handler);
  if (handler.empty() || bin == s.containerd_binaries.end()) return {};
  std::string binary = bin->second.empty() ? std::string("runc") : bin->second;
  bool ours = std::filesystem::path(binary).filename() == "gpufence-runtime";
  return {ours ? RuntimePath::gpufence : RuntimePath::other,
          cat(how, " -> handler ", handler, " -> ", binary)};
}

// The fix for a container that can open GPUs it was not allocated, as this node is set up.
std::string overreach_fix(const Snapshot& s, const NodeContainer& c, std::string_view extra) {
  auto seen = runtime_of(s, c);
  switch (seen.path) {
    case RuntimePath::gpufence:
      return cat(kFixEscaped, " [", seen.evidence, "]");
    case RuntimePath::other:
      return cat(kFixRuntime, extra, " [today: ", seen.evidence, "]");
    case RuntimePath::unknown:
      break;
  }
  return cat("if the pod does not run through gpufence-runtime: ", kFixRuntime, extra,
             "; if it does: ", kFixEscaped);
}

// "devices.list" and "oci-spec rules" say what the cgroup should allow; only the probe opened.
std::string openable_basis(const NodeContainer& c) {
  return c.openable_observed() ? std::string("probe: observed")
                               : cat(c.openable_source,
                                     ": rules, not observed; `gpufence doctor --probe` opens them");
}

const KubePod* kube_pod(const Snapshot& s, std::string_view ns, std::string_view name) {
  if (!s.kube) return nullptr;
  for (const auto& p : s.kube->pods)
    if (p.pod_namespace == ns && p.name == name) return &p;
  return nullptr;
}

}  // namespace

// gpufence's own pod, told only by what a tenant cannot set: the namespace its containers were
// created in (containerd's CRI annotations, which no pod annotation overrides:
// docs/trust-model.md) is the install's, where tenants cannot create pods, and the API server
// shows that pod controlled by one of the chart's DaemonSets. A pod's labels, annotations and
// name are its own bytes and count for nothing. How it was told, or nullopt.
std::optional<std::string> own_pod(const Snapshot& s, const NodeContainer& c) {
  if (s.system_namespace.empty() || c.pod.empty() || c.pod_namespace != s.system_namespace)
    return std::nullopt;
  const KubePod* pod = kube_pod(s, c.pod_namespace, c.pod);
  if (!pod || pod->daemonset.empty() ||
      std::find(s.system_daemonsets.begin(), s.system_daemonsets.end(), pod->daemonset) ==
          s.system_daemonsets.end())
    return std::nullopt;
  return cat("gpufence's own pod: namespace ", c.pod_namespace,
             " (the install's, --system-namespace) and controlled by DaemonSet ", pod->daemonset,
             " (the API server)");
}

namespace {

const KubeletAllocation* kubelet_entry(const Snapshot& s, const NodeContainer& c) {
  if (!s.allocations || c.pod.empty()) return nullptr;
  for (const auto& a : *s.allocations) {
    if (a.pod_namespace == c.pod_namespace && a.pod == c.pod && a.container == c.name) return &a;
  }
  return nullptr;
}

}  // namespace

bool in_kubelet_view(const Snapshot& s, const NodeContainer& c) {
  return kubelet_entry(s, c) != nullptr;
}

namespace {

// The minors of the GPUs the kubelet's device ids name (UUIDs or indices).
std::set<unsigned> minors_of_ids(const Snapshot& s, const std::vector<std::string>& ids) {
  std::set<unsigned> out;
  for (const auto& id : ids) {
    auto token = parse_device_token(id);
    if (!token) continue;
    auto gpus = resolve_token(*token, inventory(s));
    if (gpus)
      for (const auto& g : *gpus) out.insert(g.minor);
  }
  return out;
}

}  // namespace

std::optional<std::set<unsigned>> allocated_minors(const Snapshot& s, const NodeContainer& c) {
  const KubeletAllocation* entry = kubelet_entry(s, c);
  // Not a container of this kubelet's pods (its List names every container of every pod it runs,
  // those without devices too; docs/deviceplugin.md, "PodResources"): another kubelet's, another
  // runtime's or made by hand. No allocation to compare with, so none is judged.
  if (!entry) return std::nullopt;
  return minors_of_ids(s, entry->device_ids);
}

namespace {

// What a container can open beyond its allocation, when both are known.
struct Overreach {
  std::set<unsigned> allocated, extra;
  std::string evidence;
};

std::optional<Overreach> overreach(const Snapshot& s, const NodeContainer& c) {
  auto allocated = allocated_minors(s, c);
  if (!allocated || !c.openable) return std::nullopt;
  const std::set<unsigned>& reach = *c.openable;
  Overreach o{*allocated, {}, ""};
  std::set_difference(reach.begin(), reach.end(), allocated->begin(), allocated->end(),
                      std::inserter(o.extra, o.extra.end()));
  if (o.extra.empty()) return std::nullopt;
  o.evidence = cat(c.label(), ": kubelet allocated ", gpu_names(s, *allocated),
                   "; its devices cgroup (", openable_basis(c), ") lets it open ",
                   gpu_names(s, reach), "; nodes in its /dev: ", gpu_names(s, c.gpu_nodes_present),
                   c.has_cap_sys_admin ? "; privileged (CAP_SYS_ADMIN)" : "");
  return o;
}

void check_no_request_can_open(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    auto o = overreach(s, c);
    if (!o || !o->allocated.empty()) continue;
    if (auto own = own_pod(s, c)) {
      // The device plugin and gpufence-dra ask NVML about every GPU and the installer runs
      // privileged: none requests a GPU, and none runs a tenant's code.
      out.push_back({"gpu.no-request-can-open", Severity::info,
                     cat(*own, ": container ", c.label(), " requested no GPU and can open ",
                         gpu_names(s, o->extra), ", as it needs to"),
                     cat(o->evidence, "; ", *own),
                     "nothing to do: gpufence's device plugin and DRA driver open every GPU "
                     "through NVML and its installer runs privileged; no GPU is allocated to "
                     "them"});
      out.back().pod = pod_of(c);
      continue;
    }
    // A pod controlled by a DaemonSet with one of gpufence's names, outside a namespace known
    // to be gpufence's: the name proves nothing (anyone may name a DaemonSet so), but an
    // operator who ran the doctor without the install's namespace is told how to give it.
    const KubePod* pod = kube_pod(s, c.pod_namespace, c.pod);
    std::string hint;
    if (pod && !pod->daemonset.empty() &&
        std::find(s.system_daemonsets.begin(), s.system_daemonsets.end(), pod->daemonset) !=
            s.system_daemonsets.end()) {
      std::string given = s.system_namespace.empty() ? std::string("none was given")
                                                     : cat("it was given ", s.system_namespace);
      hint = cat(". If this is gpufence's own DaemonSet ", pod->daemonset,
                 ", run the doctor with --system-namespace set to the namespace gpufence was "
                 "installed in (",
                 given, "); the name alone never makes a pod gpufence's");
    }
    out.push_back(
        {"gpu.no-request-can-open", Severity::error,
         cat("container ", c.label(), " requested no GPU but can open ", gpu_names(s, o->extra)),
         o->evidence + (c.nvidia_visible_devices
                            ? "; NVIDIA_VISIBLE_DEVICES=" + *c.nvidia_visible_devices
                            : ""),
         overreach_fix(s, c,
                       " (gpufence-runtime gives a container with no allocation no GPU, and "
                       "ignores an image's NVIDIA_VISIBLE_DEVICES=all)") +
             hint});
    out.back().pod = pod_of(c);
  }
}

void check_cap_sys_admin_open_unallocated(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    auto o = overreach(s, c);
    if (!o || o->allocated.empty() || !c.has_cap_sys_admin) continue;
    out.push_back({"gpu.privileged-open-unallocated", Severity::error,
                   cat("privileged container ", c.label(), " holds ", gpu_names(s, o->extra),
                       " it was not allocated"),
                   o->evidence,
                   overreach_fix(s, c,
                                 " (it denies unallocated GPUs even to privileged containers), or "
                                 "drop privileged: true")});
    out.back().pod = pod_of(c);
  }
}

void check_open_unallocated(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    auto o = overreach(s, c);
    if (!o || o->allocated.empty() || c.has_cap_sys_admin) continue;
    out.push_back({"gpu.open-unallocated", Severity::error,
                   cat("container ", c.label(), " can open ", gpu_names(s, o->extra),
                       " it was not allocated"),
                   o->evidence, overreach_fix(s, c, "")});
    out.back().pod = pod_of(c);
  }
}

void check_process_on_unallocated(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    auto allocated = allocated_minors(s, c);
    if (!allocated) continue;
    auto used = used_minors(s, c);
    std::set<unsigned> wrong;
    std::set_difference(used.begin(), used.end(), allocated->begin(), allocated->end(),
                        std::inserter(wrong, wrong.end()));
    if (wrong.empty()) continue;
    std::vector<std::string> pids;
    for (const auto& g : s.gpus) {
      if (!wrong.contains(g.gpu.minor)) continue;
      for (const auto& p : g.processes) {
        if (container_of_pid(s, p.pid) == &c) pids.push_back(cat(p.pid, " on GPU ", g.gpu.index));
      }
    }
    out.push_back({"gpu.process-on-unallocated", Severity::error,
                   cat("container ", c.label(), " was allocated ", gpu_names(s, *allocated),
                       " but its processes run on ", gpu_names(s, wrong)),
                   cat("NVML processes: ", join(pids, ", "),
                       "; CUDA_VISIBLE_DEVICES=", c.cuda_visible_devices.value_or("(unset)"),
                       "; NVIDIA_VISIBLE_DEVICES=", c.nvidia_visible_devices.value_or("(unset)")),
                   "set CUDA_VISIBLE_DEVICES to the allocated UUID (gpufence-device-plugin and "
                   "gpufence-runtime do), "
                   "and set the app's gpu-id to 0: it counts the GPUs the container sees, not the "
                   "node's (`gpufence launch --config <ds config> -- <app>` does both)"});
    out.back().pod = pod_of(c);
  }
}

// The env should name exactly the allocation (or defer to mount markers).
void check_env_mismatch(const Snapshot& s, std::vector<Finding>& out) {
  const auto inv = inventory(s);
  for (const auto& c : s.containers) {
    auto allocated = allocated_minors(s, c);
    if (!allocated || !c.nvidia_visible_devices || allocated->empty()) continue;
    auto sel = parse_device_selector(*c.nvidia_visible_devices);
    if (!sel || sel->kind == DeviceSelector::Kind::volume_mounts) continue;
    // "void" selects no device through the environment (NVIDIA's toolkit: as plain runc).
    // gpufence's CDI spec sets it in every GPU container on purpose, so that a legacy hook adds
    // nothing; the allocation arrives as device nodes. It cannot disagree with the allocation.
    if (trim(*c.nvidia_visible_devices) == "void") continue;
    auto named = resolve_selector(*sel, inv);
    std::set<unsigned> named_minors = named ? minors_of(*named) : std::set<unsigned>{};
    if (named && named_minors == *allocated) continue;
    out.push_back(
        {"env.visible-devices-mismatch", Severity::warning,
         cat("container ", c.label(), ": NVIDIA_VISIBLE_DEVICES=", *c.nvidia_visible_devices,
             " does not match the kubelet's allocation ", gpu_names(s, *allocated)),
         cat("environment of PID ", c.pids.empty() ? 0 : c.pids.front(),
             named ? "" : "; " + named.error().message),
         "do not set NVIDIA_VISIBLE_DEVICES in the image or pod spec; the device "
         "plugin's Allocate answer sets it"});
    out.back().pod = pod_of(c);
  }
}

// DeepStream gpu-id keys index the GPUs CUDA shows the container.
void check_deepstream_gpu_ids(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    for (const auto& [path, ids] : c.app_gpu_ids) {
      size_t visible = c.gpu_nodes_present.size();
      if (c.cuda_visible_devices) {
        auto sel = parse_device_selector(*c.cuda_visible_devices);
        if (sel && sel->kind == DeviceSelector::Kind::list)
          visible = std::min(visible, sel->tokens.size());
      }
      for (int id : ids) {
        if (id >= 0 && static_cast<size_t>(id) < visible) continue;
        out.push_back({"deepstream.gpu-id-invisible", Severity::error,
                       cat("container ", c.label(), ": ", path, " sets gpu-id=", id,
                           " but the container sees ", visible, " GPU(s)"),
                       cat(path, " inside ", c.label(),
                           "; GPU nodes in its /dev: ", gpu_names(s, c.gpu_nodes_present),
                           "; CUDA_VISIBLE_DEVICES=", c.cuda_visible_devices.value_or("(unset)")),
                       "gpu-id counts the GPUs the container sees, from 0: set gpu-id=0 in every "
                       "group and nvinfer config, or start the app with `gpufence launch --config "
                       "<this file> -- <app>`"});
        out.back().pod = pod_of(c);
      }
    }
  }
}

// Two containers on one GPU.
void check_shared(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& g : s.gpus) {
    std::set<const NodeContainer*> users;
    for (const auto& p : g.processes) {
      if (const auto* c = container_of_pid(s, p.pid)) users.insert(c);
    }
    if (users.size() < 2) continue;
    std::vector<std::string> names;
    for (const auto* c : users) names.push_back(c->label());
    out.push_back({"gpu.shared", Severity::error,
                   cat(users.size(), " containers with exclusive GPU requests use GPU ",
                       g.gpu.index, " (", g.gpu.uuid, ") at once"),
                   cat("NVML lists processes of ", join(names, " and "), " on ", g.gpu.uuid),
                   "each container must use only its allocated GPU: enforce it with "
                   "gpufence-runtime and set CUDA_VISIBLE_DEVICES"});
  }
}

void check_runtimeclass_missing(const Snapshot& s, std::vector<Finding>& out) {
  if (!s.kube) return;
  for (const auto& pod : s.kube->pods) {
    if (pod.gpus <= 0 || pod.runtime_class.empty() ||
        s.kube->runtime_classes.contains(pod.runtime_class))
      continue;
    std::vector<std::string> classes;
    for (const auto& [k, v] : s.kube->runtime_classes) classes.push_back(k);
    out.push_back({"pod.runtimeclass-missing", Severity::error,
                   cat("pod ", pod.pod_namespace, "/", pod.name, " names RuntimeClass '",
                       pod.runtime_class, "', which does not exist"),
                   cat("spec.runtimeClassName = ", pod.runtime_class, "; RuntimeClasses: ",
                       classes.empty() ? std::string("none") : join(classes, ", ")),
                   "kubectl apply -f deploy/kubernetes/runtimeclass.yaml (handler nvidia), and run "
                   "`gpufence setup containerd --runtime-name nvidia` on the node"});
  }
}

void check_no_gpu_runtime(const Snapshot& s, std::vector<Finding>& out) {
  if (!s.kube) return;
  // gpufence-nri enforces pods without a handler (nri.* judges whether it can): as install
  // recorded, or seen connected now (a DaemonSet or service install has no record of).
  if (s.nri && s.nri->enforcing() && s.nri->enabled && s.nri->socket_present) return;
  std::string default_bin = s.containerd_default_binary;
  std::string base =
      default_bin.empty() ? "" : std::filesystem::path(default_bin).filename().string();
  if (base == "gpufence-runtime" || base.starts_with("nvidia-container-runtime")) return;
  for (const auto& pod : s.kube->pods) {
    if (pod.gpus <= 0 || !pod.runtime_class.empty()) continue;
    out.push_back(
        {"pod.no-gpu-runtime", pod.privileged ? Severity::error : Severity::warning,
         cat("GPU pod ", pod.pod_namespace, "/", pod.name,
             " has no runtimeClassName and containerd's default runtime does not enforce GPU "
             "allocation",
             pod.privileged ? " (privileged: it sees every GPU)" : ""),
         cat("requests ", pod.gpus, " ", s.resource_name, "; containerd default runtime runs ",
             default_bin.empty() ? std::string("plain runc") : default_bin),
         "set runtimeClassName: nvidia in the pod spec (and `gpufence setup containerd`); "
         "making gpufence the default runtime also moves the node agents' own pods onto it "
         "(see `gpufence setup containerd --help`, --set-as-default)"});
  }
}

std::string age_text(std::chrono::seconds age) {
  return age.count() >= 120 ? cat(age.count() / 60, " min") : cat(age.count(), " s");
}

// A pod the kubelet gave GPUs (PodResources, or its device checkpoint by pod UID) with no
// container of it running on the node for longer than held_after: its sandbox can never be
// created (a RuntimeClass whose handler containerd lacks), or it crash-loops, while the kubelet
// retries and keeps the GPUs from every other pod. Its age is the API server's, so this needs it.
void check_gpu_held_without_container(const Snapshot& s, std::vector<Finding>& out) {
  if (!s.kube) return;
  struct Held {
    std::vector<std::string> ids, from;
  };
  std::map<std::pair<std::string, std::string>, Held> held;
  auto add = [&](const std::string& ns, const std::string& pod, const std::vector<std::string>& ids,
                 std::string from) {
    auto& h = held[{ns, pod}];
    for (const auto& id : ids)
      if (std::find(h.ids.begin(), h.ids.end(), id) == h.ids.end()) h.ids.push_back(id);
    h.from.push_back(std::move(from));
  };
  if (s.allocations) {
    for (const auto& a : *s.allocations) {
      if (a.device_ids.empty()) continue;
      add(a.pod_namespace, a.pod, a.device_ids,
          cat("PodResources: container ", a.container, " ", join(a.device_ids, ",")));
    }
  }
  for (const auto& e : s.checkpoint) {
    if (e.device_ids.empty() || e.pod_uid.empty()) continue;
    auto pod = std::find_if(s.kube->pods.begin(), s.kube->pods.end(),
                            [&](const KubePod& p) { return p.uid == e.pod_uid; });
    if (pod == s.kube->pods.end()) continue;
    add(pod->pod_namespace, pod->name, e.device_ids,
        cat(s.checkpoint_path, ": PodUID ", e.pod_uid, " container ", e.container, " ",
            join(e.device_ids, ",")));
  }
  for (const auto& [key, h] : held) {
    const auto& [ns, name] = key;
    bool running = std::any_of(s.containers.begin(), s.containers.end(), [&](const auto& c) {
      return c.pod_namespace == ns && c.pod == name;
    });
    if (running) continue;
    const KubePod* pod = kube_pod(s, ns, name);
    // A finished pod's devices go back to the pool; one the API does not know is being deleted.
    if (!pod || !pod->started || pod->phase == "Succeeded" || pod->phase == "Failed") continue;
    auto age = std::chrono::duration_cast<std::chrono::seconds>(s.taken_at - *pod->started);
    if (age < s.held_after) continue;
    std::string cause;
    if (!pod->runtime_class.empty()) {
      auto rc = s.kube->runtime_classes.find(pod->runtime_class);
      if (rc == s.kube->runtime_classes.end())
        cause = cat("; RuntimeClass ", pod->runtime_class, " does not exist");
      else if (!s.containerd_config.empty() && !s.containerd_binaries.contains(rc->second))
        cause = cat("; RuntimeClass ", pod->runtime_class, " -> handler ", rc->second,
                    ", which containerd's config (", s.containerd_config,
                    ") does not have: its sandbox can never be created");
    }
    out.push_back(
        {"pod.gpu-held-without-container", Severity::warning,
         cat("pod ", ns, "/", name, " holds ", gpu_names(s, minors_of_ids(s, h.ids)),
             " but no container of it has been running on this node for ", age_text(age),
             ": no other pod can have those GPUs while the kubelet retries it"),
         cat(join(h.from, "; "), "; no process of the pod on the node; phase ",
             pod->phase.empty() ? std::string("(none)") : pod->phase, ", started ", age_text(age),
             " ago",
             pod->waiting.empty() ? std::string() : cat("; waiting: ", join(pod->waiting, ", ")),
             cause),
         cat("see why it does not start (kubectl describe pod -n ", ns, " ", name,
             ": events such as FailedCreatePodSandBox), then fix that or delete the pod: the "
             "kubelet gives its GPUs back only when the pod is gone")});
  }
}

void check_pod_env(const Snapshot& s, std::vector<Finding>& out) {
  if (!s.kube) return;
  for (const auto& pod : s.kube->pods) {
    if (pod.gpus <= 0) continue;
    for (const auto& env : pod.env_visible_devices) {
      out.push_back({"pod.env-visible-devices", Severity::warning,
                     cat("pod ", pod.pod_namespace, "/", pod.name,
                         " sets NVIDIA_VISIBLE_DEVICES in its spec (", env, ")"),
                     cat("pod spec container ", env),
                     "remove it: the device plugin's Allocate answer sets the allocation; a "
                     "pod-set value is either ignored or, with env-trusting runtimes, grants GPUs "
                     "the kubelet never allocated"});
    }
  }
}

constexpr const char* kFixPlugin =
    "the device plugin is not registered (what keeps GPU Operator's validator at Init:3/4): run "
    "gpufence-device-plugin (deploy/kubernetes/device-plugin.yaml) with the kubelet's plugin "
    "directory";

std::string sockets(const Snapshot& s) {
  return s.plugin_sockets.empty() ? std::string("none") : join(s.plugin_sockets, ", ");
}

// What the node advertises (the API's view, else the kubelet's) against the GPUs present.
// The GPU devices this node's ResourceSlices publish, by GPU DRA driver ("gpufence.io: 2").
std::vector<std::string> dra_gpu_drivers(const Snapshot& s, long& devices) {
  std::vector<std::string> out;
  devices = 0;
  if (!s.kube) return out;
  for (const auto& [driver, n] : s.kube->dra_devices) {
    if (n <= 0 || std::find(s.gpu_dra_drivers.begin(), s.gpu_dra_drivers.end(), driver) ==
                      s.gpu_dra_drivers.end())
      continue;
    devices += n;
    out.push_back(cat(driver, ": ", n));
  }
  return out;
}

void check_gpu_capacity(const Snapshot& s, std::vector<Finding>& out) {
  if (s.gpus.empty()) return;
  if (s.kube && s.kube->capacity) {
    long cap = *s.kube->capacity;
    if (cap != 0 && cap >= static_cast<long>(s.gpus.size())) return;
    // Served through DRA instead: the node advertises none by design (docs/dra.md).
    long dra = 0;
    if (cap == 0 && !dra_gpu_drivers(s, dra).empty() && dra >= static_cast<long>(s.gpus.size()))
      return;
    out.push_back({"node.gpu-capacity", Severity::error,
                   cat("the node advertises ", cap, " ", s.resource_name, " but ", s.gpus.size(),
                       " GPU(s) are present"),
                   cat("node status capacity ", s.resource_name, "=", cap, ", allocatable=",
                       s.kube->allocatable.value_or(0), "; device plugin sockets: ", sockets(s)),
                   kFixPlugin});
    return;
  }
  if (!s.allocatable || !s.allocatable->empty()) return;
  out.push_back({"node.gpu-capacity", Severity::error,
                 cat("the kubelet has no allocatable ", s.resource_name, " although ",
                     s.gpus.size(), " GPU(s) are present"),
                 cat("PodResources GetAllocatableResources lists no ", s.resource_name,
                     " devices; device plugin sockets: ", sockets(s)),
                 kFixPlugin});
}

// One resource through two backends: a device plugin's nvidia.com/gpu and a GPU DRA driver's
// slices on one node. The scheduler then counts the same GPUs twice: a plain limit takes the
// plugin's count, a claim the slice's device, and both can land on one GPU.
void check_gpu_two_backends(const Snapshot& s, std::vector<Finding>& out) {
  // Allocatable, not capacity: after a switch to DRA the kubelet keeps a removed plugin's
  // capacity (with allocatable 0) for a while.
  if (!s.kube || !s.kube->allocatable || *s.kube->allocatable <= 0) return;
  long dra = 0;
  auto drivers = dra_gpu_drivers(s, dra);
  if (drivers.empty()) return;
  out.push_back(
      {"node.gpu-two-backends", Severity::error,
       cat("the node's GPUs are served twice: ", *s.kube->allocatable, " ", s.resource_name,
           " from a device plugin and ", dra, " device(s) from DRA (", join(drivers, ", "),
           "): one GPU can be given to a pod of each"),
       cat("node status allocatable ", s.resource_name, "=", *s.kube->allocatable,
           "; this node's ResourceSlices: ", join(drivers, ", "),
           "; device plugin sockets: ", sockets(s)),
       "run one of them on this node: the chart's allocation is device-plugin or dra, never "
       "both (docs/dra.md); remove the other's DaemonSet from this node"});
}

void check_gpu_not_allocatable(const Snapshot& s, std::vector<Finding>& out) {
  if ((s.kube && s.kube->capacity) || !s.allocatable || s.allocatable->empty() ||
      s.allocatable->size() >= s.gpus.size())
    return;
  std::vector<std::string> missing;
  for (const auto& g : s.gpus) {
    bool listed =
        std::any_of(s.allocatable->begin(), s.allocatable->end(), [&](const std::string& id) {
          return id == g.gpu.uuid || id == std::to_string(g.gpu.index);
        });
    if (!listed) missing.push_back(cat("GPU ", g.gpu.index, " (", g.gpu.uuid, ")"));
  }
  out.push_back({"node.gpu-not-allocatable", Severity::warning,
                 cat(join(missing, ", "),
                     " present but not allocatable by the kubelet (unhealthy or not advertised)"),
                 cat("allocatable: ", join(*s.allocatable, ", ")),
                 "check the device plugin's log for health events (XIDs) on those GPUs"});
}

// The kubelet replays each container's stored Allocate answer (devicemanager manager.go
// GetDeviceRunContainerOptions) on a restart and after a reboot. Device specs name GPUs by minor,
// the ids by UUID: when a GPU's minor changed since the answer was stored, the next create of that
// container gets another GPU's node, which gpufence-runtime refuses (docs/trust-model.md,
// "Renumbered GPUs"): say so before the pod crash-loops.
void check_checkpoint_renumbered(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& e : s.checkpoint) {
    if (e.device_minors.empty()) continue;
    for (const auto& id : e.device_ids) {
      auto g = std::find_if(s.gpus.begin(), s.gpus.end(),
                            [&](const NodeGpu& n) { return n.gpu.uuid == id; });
      if (g == s.gpus.end()) continue;
      if (std::find(e.device_minors.begin(), e.device_minors.end(), g->gpu.minor) !=
          e.device_minors.end())
        continue;
      std::vector<std::string> nodes;
      for (unsigned m : e.device_minors) nodes.push_back(cat("/dev/nvidia", m));
      out.push_back(
          {"gpu.checkpoint-renumbered", Severity::error,
           cat("the kubelet's stored Allocate answer for pod ", e.pod_uid, " container ",
               e.container, " gives ", join(nodes, ","), " for ", id, ", which is /dev/nvidia",
               g->gpu.minor,
               " now: the GPUs were renumbered since (a reboot?); gpufence-runtime "
               "refuses the container's next create"),
           cat(s.checkpoint_path, ": PodUID ", e.pod_uid, ", ContainerName ", e.container,
               ", DeviceIDs ", join(e.device_ids, ","), ", device specs ", join(nodes, ",")),
           "delete the pod so that its controller recreates it with a fresh allocation "
           "(the kubelet replays a stored answer for as long as the pod exists)"});
    }
  }
}

// One GPU device (kind and name, kGpuCdiKinds) defined by two spec files of one directory: the
// CDI cache (containerd 1.7/2.x) drops it as a conflict, so every pod naming it fails
// "unresolvable CDI devices", and gpufence-runtime refuses it. A file of a later directory that
// overrides one of an earlier directory is upstream's documented priority, not a finding.
// See docs/cdi.md, "Conflicts".
void check_cdi_duplicate_device(const Snapshot& s, std::vector<Finding>& out) {
  std::vector<CdiFileSummary> gpu_files;
  for (const auto& f : s.cdi_specs)
    if (is_gpu_cdi_kind(f.kind)) gpu_files.push_back(f);
  std::map<std::vector<std::string>, std::vector<std::string>> by_files;  // files -> devices
  for (const auto& dup : duplicate_cdi_devices(gpu_files)) {
    if (dup.resolution == CdiDuplicateDevice::Resolution::conflict)
      by_files[dup.winners].push_back(dup.name);
  }
  for (const auto& [files, devices] : by_files) {
    out.push_back(
        {"cdi.duplicate-device", Severity::error,
         cat(files.size(),
             " CDI specs in one directory define the same device(s), which the CDI cache then "
             "drops (\"unresolvable CDI devices\"): ",
             join(devices, ", ")),
         cat("spec files: ", join(files, " and ")),
         cat("keep one spec per kind in each directory: remove or move the others (two "
             "generators writing one kind, e.g. `nvidia-ctk cdi generate` and the GPU "
             "Operator, or `gpufence cdi generate` into /var/run/cdi next to NVIDIA's ",
             kNvidiaCdiKind, " spec; gpufence-device-plugin's own spec is kind ", kCdiKind,
             " and conflicts with none of them)")});
  }
}

// A process of the container outside its devices cgroup: no rule of that cgroup binds it.
void check_left_devices_cgroup(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    // As every check: a container the kubelet's PodResources does not name (another kubelet's,
    // another runtime's, made by hand) is listed under Skipped, not judged.
    if (c.left_cgroup.empty() || (s.allocations && !in_kubelet_view(s, c))) continue;
    auto seen = runtime_of(s, c);
    out.push_back(
        {"gpu.left-devices-cgroup", Severity::error,
         cat("container ", c.label(),
             " has processes outside its devices cgroup: what they can open is not what its "
             "rules say"),
         cat(join(c.left_cgroup, "; "), c.has_cap_sys_admin ? "; privileged (CAP_SYS_ADMIN)" : "",
             seen.path == RuntimePath::unknown ? "" : "; " + seen.evidence),
         cat("a process leaves its devices cgroup by writing another cgroup's cgroup.procs, which "
             "takes a writable cgroup filesystem (privileged, CAP_SYS_ADMIN, or a cgroupfs "
             "volume); no runtime's rules bind it then. Drop privileged: true, CAP_SYS_ADMIN and "
             "any hostPath of /sys/fs/cgroup from the pod spec and recreate the pod "
             "(docs/trust-model.md, \"Volumes of the cgroup filesystem\")")});
    out.back().pod = pod_of(c);
  }
}

// The containers these checks are about: those the kubelet gave GPUs; without its view, those
// with a GPU node in their /dev.
bool gpu_container(const Snapshot& s, const NodeContainer& c) {
  if (auto allocated = allocated_minors(s, c)) return !allocated->empty();
  return !s.allocations && !c.gpu_nodes_present.empty();
}

std::string caps_text(const NodeContainer& c) {
  auto has = [](const std::optional<unsigned long long>& set, int cap) {
    return set ? (((*set >> cap) & 1) ? "yes" : "no") : "?";
  };
  return cat("CAP_SYS_PTRACE effective ", has(c.cap_eff, kCapSysPtrace), ", bounding ",
             has(c.cap_bnd, kCapSysPtrace));
}

// hostPID: its processes see every process on the node, and ptrace(2) or pidfd_getfd(2) on
// another GPU container's process copies that process's open /dev/nvidiaN descriptor: the
// devices cgroup checks only open(2) (docs/trust-model.md, "Routes around the devices cgroup").
void check_host_pid(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    if (!c.host_pid.value_or(false) || !gpu_container(s, c)) continue;
    out.push_back(
        {"pod.host-pid", Severity::error,
         cat("GPU container ", c.label(),
             " shares the host's PID namespace (hostPID): it can reach other containers' GPU "
             "descriptors"),
         cat("/proc/", c.pids.empty() ? 0 : c.pids.front(), "/ns/pid is PID 1's; ", caps_text(c),
             "; kernel.yama.ptrace_scope ", s.ptrace_scope.value_or("unset (no Yama)")),
         "remove hostPID: true from the pod spec (Pod Security `baseline` forbids it): with it, "
         "pidfd_getfd(2) or ptrace(2) on another GPU container's process takes its open "
         "/dev/nvidiaN, which no devices cgroup checks (docs/trust-model.md)"});
    out.back().pod = pod_of(c);
  }
}

void check_sys_ptrace(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    bool eff = c.cap_eff && ((*c.cap_eff >> kCapSysPtrace) & 1);
    bool bnd = c.cap_bnd && ((*c.cap_bnd >> kCapSysPtrace) & 1);
    if (!(eff || bnd) || !gpu_container(s, c)) continue;
    bool host_pid = c.host_pid.value_or(false);
    out.push_back(
        {"pod.cap-sys-ptrace", host_pid ? Severity::error : Severity::warning,
         cat("GPU container ", c.label(), " has CAP_SYS_PTRACE",
             host_pid ? " and the host's PID namespace" : "",
             c.has_cap_sys_admin ? " (privileged)" : ""),
         cat("/proc/", c.pids.empty() ? 0 : c.pids.front(), "/status: ", caps_text(c),
             "; host PID namespace: ", c.host_pid ? (*c.host_pid ? "yes" : "no") : "unknown"),
         cat("drop SYS_PTRACE from securityContext.capabilities",
             c.has_cap_sys_admin ? " and privileged: true" : "",
             ": it lets ptrace(2) and pidfd_getfd(2) reach any process the container can see "
             "whatever Yama's ptrace_scope 1 allows, and copy an open /dev/nvidiaN descriptor "
             "(docs/trust-model.md)")});
    out.back().pod = pod_of(c);
  }
}

// sysfs the container can write: /sys/bus/pci/devices/<bdf>/remove or driver/unbind takes a GPU
// from every pod on it, and no devices cgroup rule covers sysfs files.
void check_writable_sysfs(const Snapshot& s, std::vector<Finding>& out) {
  for (const auto& c : s.containers) {
    if (c.writable_sysfs.empty() || !gpu_container(s, c)) continue;
    out.push_back(
        // A privileged container can write sysfs whatever is mounted (docs/trust-model.md,
        // "Privileged containers, honestly"): a warning that says so; an unprivileged one with
        // a writable sysfs volume is an error.
        {"pod.writable-sysfs", c.has_cap_sys_admin ? Severity::warning : Severity::error,
         cat("GPU container ", c.label(),
             " can write sysfs: it can unbind or remove any GPU on the node"),
         cat("/proc/", c.pids.empty() ? 0 : c.pids.front(), "/mountinfo: sysfs mounted rw at ",
             join(c.writable_sysfs, ", "), c.has_cap_sys_admin ? "; privileged" : ""),
         cat("mount /sys and anything below it read-only (volumeMounts readOnly: true) or not at "
             "all",
             c.has_cap_sys_admin
                 ? ", and drop privileged: true (runc mounts a privileged container's "
                   "/sys read-write)"
                 : "",
             ": /sys/bus/pci/devices/<bdf>/remove and driver/unbind take the GPU away from "
             "every pod (docs/trust-model.md)")});
    out.back().pod = pod_of(c);
  }
}

// The node was installed with NRI enforcement (install record): containerd must run NRI, and
// creates must fail while gpufence-nri is down — required_plugins, containerd >= 2.2 only
// (nri@v0.12.0:plugins/default-validator; docs/nri.md, "Fail closed").
// gpufence-nri's own account (its status file): is it running and connected to containerd?
void check_nri_plugin_connected(const NriView& n, const std::string& mode,
                                std::vector<Finding>& out) {
  std::string summary, evidence;
  if (!n.status) {
    summary =
        "gpufence-nri has never reported on this node: it is not running, or writes its "
        "status elsewhere ([nri] status_file)";
    evidence = cat(mode, "; ", n.status_error);
  } else if (n.plugin_process == NriView::Process::gone) {
    summary = cat("gpufence-nri is not running (pid ", n.status->pid,
                  " is gone or is another "
                  "process now)");
    evidence = cat(mode, "; ", n.status_file, ": last ", nri::nri_state_name(n.status->state),
                   " since ", n.status->since);
  } else if (n.status->state != nri::NriState::connected) {
    summary = cat("gpufence-nri runs but is not connected to containerd (",
                  nri::nri_state_name(n.status->state), " since ", n.status->since, ")");
    evidence =
        cat(mode, "; ", n.status_file, ": pid ", n.status->pid, ", socket ", n.status->socket);
  } else {
    return;
  }
  out.push_back(
      {"nri.plugin-down", Severity::error,
       cat(summary, n.fail_closed() ? ": every container create fails until it is back "
                                      "(required_plugins)"
                                    : ": containers created meanwhile are not enforced"),
       evidence,
       "installed by `gpufence install` (containerd starts plugin_path/10-gpufence-nri): "
       "`systemctl restart containerd`, then check containerd's log for the plugin; run as a "
       "service or DaemonSet: start it. Then run `gpufence doctor` again: it lists the "
       "containers created while the plugin was down (nri.created-while-down)"});
}

// The containers containerd showed gpufence-nri at its last Synchronize with no decision of its
// own whose decision would change their GPU access. Those that run through a handler whose binary
// is gpufence-runtime were enforced by the shim instead.
void check_nri_created_while_down(const Snapshot& s, const NriView& n, std::vector<Finding>& out) {
  if (!n.status) return;
  for (const auto& c : n.status->unenforced) {
    auto bin = s.containerd_binaries.find(c.runtime_handler);
    if (!c.runtime_handler.empty() && bin != s.containerd_binaries.end() &&
        std::filesystem::path(bin->second).filename() == "gpufence-runtime")
      continue;
    // gpufence's own pods start before gpufence-nri can (the installer puts it there) and need
    // every GPU (NVML in the device plugin); the same unforgeable facts as for their GPU access.
    auto same = std::find_if(s.containers.begin(), s.containers.end(),
                             [&](const NodeContainer& nc) { return nc.id == c.id; });
    // Gone since that Synchronize (its pod deleted or recreated): it holds nothing now. Only when
    // this node's containers were read at all; otherwise every entry stands.
    if (same == s.containers.end() && !s.containers.empty()) continue;
    if (auto own = same != s.containers.end() ? own_pod(s, *same) : std::nullopt) {
      out.push_back({"nri.created-while-down", Severity::info,
                     cat(*own, ": container ", c.name, " of pod ", c.pod,
                         " was created before gpufence-nri ran, as the node agents are"),
                     cat(c.why, "; container ", c.id), "nothing to do"});
      continue;
    }
    out.push_back(
        {"nri.created-while-down", Severity::error,
         cat("container ", c.name, " of pod ", c.pod,
             " was created without gpufence-nri: its GPU access is what containerd gave it"),
         cat(c.why, "; container ", c.id, ", handler ",
             c.runtime_handler.empty() ? std::string("(containerd's default)") : c.runtime_handler,
             "; seen by gpufence-nri at ", n.status->synchronized_at, " (", n.status_file, ")"),
         cat("recreate the pod now that gpufence-nri is up (kubectl delete pod -n ",
             c.pod.substr(0, c.pod.find('/')), " ", c.pod.substr(c.pod.find('/') + 1),
             "; its controller makes a new one); on containerd >= 2.2, required_plugins stops "
             "creates while the plugin is down (`gpufence install --enforcement nri`)")});
  }
}

// Connected, but no judgement of containerd's containers finished for this connection, for longer
// than a judgement takes: nri.created-while-down may then miss what was created while it was down
// (a judgement that overruns is listed as "not judged", so this is a stuck or starved plugin).
inline constexpr int64_t kUnjudgedAfterS = 60;
void check_nri_sync_unjudged(const NriView& n, std::vector<Finding>& out) {
  if (!n.status || n.status->state != nri::NriState::connected ||
      n.plugin_process != NriView::Process::running || n.connected_for_s < kUnjudgedAfterS)
    return;
  if (!n.status->synchronized_at.empty() && !n.status->judgement_stale) return;
  out.push_back(
      {"nri.sync-unjudged", Severity::warning,
       cat("gpufence-nri is connected but has not judged containerd's containers for ",
           n.connected_for_s,
           " s: containers created while it was down may be missing from "
           "nri.created-while-down"),
       cat("connected since ", n.status->since, "; last judgement ",
           n.status->synchronized_at.empty() ? std::string("none")
                                             : cat(n.status->synchronized_at, " (stale)"),
           " (", n.status_file, ")"),
       "look at gpufence-nri's log for nri.unjudged or a stalled process; restarting it (kill it: "
       "its keeper starts it again) makes containerd synchronize again"});
}

// Go's strconv.ParseBool true, which NRI's default validator applies to the waiver's value
// (nri@v0.12.0 plugins/default-validator validateRequiredPlugins); anything else is false or,
// unparsable, a rejected container.
bool go_bool_true(std::string_view v) {
  return v == "1" || v == "t" || v == "T" || v == "TRUE" || v == "true" || v == "True";
}

// The pod's annotations that are the waiver `key` in one of the forms NRI reads
// (nri@v0.12.0 pkg/plugin GetEffectiveAnnotation): KEY/container.NAME, KEY/pod, KEY.
std::vector<std::pair<std::string, std::string>> waiver_forms(const KubePod& pod,
                                                              const std::string& key) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : pod.annotations)
    if (k == key || k == key + "/pod" || k.starts_with(key + "/container.")) out.emplace_back(k, v);
  return out;
}

// containerd's config lets a pod annotation waive required_plugins while gpufence-nri is
// required: any pod can be created undecided while the plugins are down. And the running pods
// that carry that annotation (the API server's view).
void check_nri_waiver(const Snapshot& s, const NriView& n, std::vector<Finding>& out) {
  if (n.tolerate_annotation.empty() || !n.fail_closed()) return;
  const std::string& key = n.tolerate_annotation;
  out.push_back(
      {"nri.waiver-in-config", Severity::error,
       cat("containerd lets any pod waive required_plugins: a pod annotated ", key,
           ": \"true\" (or ", key, "/pod, ", key,
           "/container.NAME) is created without gpufence-nri's decision while it is down"),
       cat(s.containerd_config,
           ": [plugins.\"io.containerd.nri.v1.nri\".default_validator] "
           "tolerate_missing_plugins_annotation = \"",
           key, "\", required_plugins = [", join(n.required_plugins, ", "),
           "]; NRI reads the key from the pod's own annotations"),
       cat("remove tolerate_missing_plugins_annotation from containerd's config (`gpufence "
           "install` takes out a key it wrote and writes none), or forbid the annotation in "
           "every form with an admission policy (the chart's ValidatingAdmissionPolicy "
           "gpufence-no-nri-waiver: docs/install.md, \"Helm\")")});
  if (!s.kube) return;  // gather says the pods were not checked
  for (const auto& pod : s.kube->pods) {
    auto forms = waiver_forms(pod, key);
    if (forms.empty()) continue;
    bool waives = std::any_of(forms.begin(), forms.end(),
                              [](const auto& f) { return go_bool_true(f.second); });
    std::vector<std::string> shown;
    for (const auto& [k, v] : forms) shown.push_back(cat(k, "=", v));
    out.push_back(
        {"nri.pod-waiver", waives ? Severity::error : Severity::warning,
         cat("pod ", pod.pod_namespace, "/", pod.name, " carries the NRI waiver annotation",
             waives ? ": its containers are created without gpufence-nri whenever it is down"
                    : " (not \"true\": no waiver today)"),
         cat("annotations ", join(shown, ", "),
             "; containerd's tolerate_missing_plugins_annotation = \"", key, "\""),
         cat("remove the annotation (kubectl annotate pod -n ", pod.pod_namespace, " ", pod.name,
             " ", key,
             "-, and from its controller's template) and forbid it with an admission "
             "policy; recreate the pod if it was created while gpufence-nri was down")});
  }
}

// containerd >= 2.2, gpufence-nri required: the fence must be required and linked too, or a
// container the decider did not decide (its answer timed out, it dropped mid-request: NRI then
// goes on as if it had answered nothing) is created unadjusted while gpufence-nri still counts
// as present.
void check_nri_fence(const Snapshot& s, const NriView& n, const std::string& mode,
                     std::vector<Finding>& out) {
  if (!n.fail_closed()) return;  // below 2.2, or not required: nri.not-fail-closed says so
  const bool required = n.required(n.fence_name);
  if (required && n.fence_link_present) return;
  std::vector<std::string> missing;
  if (!required) missing.push_back(cat("not in required_plugins (", s.containerd_config, ")"));
  if (!n.fence_link_present) missing.push_back(cat("no plugin at ", n.fence_link));
  out.push_back(
      {"nri.fence-missing", n.enforcement == "nri" ? Severity::error : Severity::warning,
       cat(n.fence_name,
           " is not in place: a container gpufence-nri did not decide (its answer timed out, or "
           "it dropped mid-request) is created unadjusted"),
       cat(mode, "; ", n.fence_name, ": ", join(missing, "; "), "; required_plugins = [",
           join(n.required_plugins, ", "), "]"),
       cat("`gpufence install --enforcement ", n.enforcement, "` links ", n.fence_link,
           " to gpufence-nri and adds \"", n.fence_name,
           "\" to default_validator.required_plugins (containerd >= 2.2), then restarts "
           "containerd")});
}

void check_nri(const Snapshot& s, std::vector<Finding>& out) {
  if (!s.nri) return;
  check_nri_created_while_down(s, *s.nri, out);
  check_nri_sync_unjudged(*s.nri, out);
  check_nri_waiver(s, *s.nri, out);
  if (!s.nri->uses_nri()) return;
  const NriView& n = *s.nri;
  const std::string mode = cat("enforcement ", n.enforcement, " (", n.state_file, ")");
  check_nri_plugin_connected(n, mode, out);
  check_nri_fence(s, n, mode, out);
  if (!n.enabled) {
    out.push_back({"nri.disabled", Severity::error,
                   "gpufence was installed to enforce through NRI, but containerd's config has "
                   "NRI off: GPU pods without the handler are not enforced",
                   cat(mode, "; ", s.containerd_config,
                       ": [plugins.\"io.containerd.nri.v1.nri\"] "
                       "disable = true (or unset on containerd 1.7, where off is the default)"),
                   cat("gpufence install --enforcement ", n.enforcement,
                       " (sets disable = false and restarts containerd)")});
  } else if (!n.socket_present) {
    out.push_back({"nri.socket-missing", Severity::error,
                   cat("no NRI socket at ", n.socket_path,
                       ": containerd is not running NRI (down, or started on another config)"),
                   cat(mode, "; NRI on in ", s.containerd_config),
                   "restart containerd on its config (systemctl restart containerd) and check "
                   "its log for the NRI plugin; `gpufence install` verifies the socket"});
  }
  if (!n.fail_closed()) {
    const bool only_nri = n.enforcement == "nri";
    out.push_back(
        {"nri.not-fail-closed", only_nri ? Severity::error : Severity::warning,
         "NRI enforcement not guaranteed while gpufence-nri is down: containerd creates "
         "containers unadjusted when the plugin is not connected",
         cat(mode, "; default_validator ", n.validator_enabled ? "on" : "off",
             ", required_plugins = [", join(n.required_plugins, ", "), "] in ",
             s.containerd_config),
         cat("containerd >= 2.2: `gpufence install --enforcement ", n.enforcement,
             "` sets default_validator.required_plugins = [\"", n.plugin_name, "\", \"",
             n.fence_name,
             "\"]; below 2.2 (no required_plugins) pair it with the shim "
             "(`gpufence install --enforcement both`, GPU pods with runtimeClassName: nvidia) or "
             "upgrade containerd to 2.2+")});
  }
}

// A handler no RuntimeClass names, on a node where gpufence-nri enforces pods without one: the
// default --handler of an NRI install (which adds none), not a pod that cannot start.
bool handler_unneeded(const Snapshot& s, const Finding& f) {
  if (f.id != "containerd.handler-missing" || !s.kube || !s.nri || !s.nri->enforcing() ||
      !s.nri->enabled || !s.nri->socket_present)
    return false;
  auto open = f.summary.find('\'');
  auto close = open == std::string::npos ? open : f.summary.find('\'', open + 1);
  if (close == std::string::npos) return false;
  std::string handler = f.summary.substr(open + 1, close - open - 1);
  for (const auto& [name, h] : s.kube->runtime_classes)
    if (h == handler) return false;
  return true;
}

void copy_containerd_findings(const Snapshot& s, std::vector<Finding>& out) {
  for (auto f : s.containerd_findings) {
    if (handler_unneeded(s, f)) {
      f.severity = Severity::info;
      f.summary += " (no RuntimeClass names it, and gpufence-nri enforces pods without one)";
      f.fix = "nothing to do while no RuntimeClass names it";
    }
    out.push_back(std::move(f));
  }
}

const std::vector<DoctorCheck> kChecks = {
    {"gpu.open-unallocated", check_open_unallocated},
    {"gpu.privileged-open-unallocated", check_cap_sys_admin_open_unallocated},
    {"gpu.no-request-can-open", check_no_request_can_open},
    {"gpu.process-on-unallocated", check_process_on_unallocated},
    {"env.visible-devices-mismatch", check_env_mismatch},
    {"deepstream.gpu-id-invisible", check_deepstream_gpu_ids},
    {"gpu.shared", check_shared},
    {"pod.runtimeclass-missing", check_runtimeclass_missing},
    {"pod.no-gpu-runtime", check_no_gpu_runtime},
    {"pod.gpu-held-without-container", check_gpu_held_without_container},
    {"pod.env-visible-devices", check_pod_env},
    {"node.gpu-capacity", check_gpu_capacity},
    {"node.gpu-not-allocatable", check_gpu_not_allocatable},
    {"node.gpu-two-backends", check_gpu_two_backends},
    {"cdi.duplicate-device", check_cdi_duplicate_device},
    {"gpu.left-devices-cgroup", check_left_devices_cgroup},
    {"gpu.checkpoint-renumbered", check_checkpoint_renumbered},
    {"pod.host-pid", check_host_pid},
    {"pod.cap-sys-ptrace", check_sys_ptrace},
    {"pod.writable-sysfs", check_writable_sysfs},
    {"nri.*", check_nri},
    {"containerd.*", copy_containerd_findings},
};

}  // namespace

bool check_id_matches(std::string_view entry, std::string_view id) {
  if (entry.ends_with(".*")) return id.starts_with(entry.substr(0, entry.size() - 1));
  return id == entry;
}

const std::vector<DoctorCheck>& doctor_checks() {
  return kChecks;
}

const std::vector<std::string>& doctor_check_ids() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> out;
    for (const auto& c : kChecks) out.emplace_back(c.id);
    return out;
  }();
  return ids;
}

std::vector<Finding> judge(const Snapshot& s) {
  std::vector<Finding> out;
  for (const auto& check : kChecks) check.run(s, out);
  std::stable_sort(out.begin(), out.end(),
                   [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
  return out;
}

}  // namespace gpufence
