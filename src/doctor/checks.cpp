#include "doctor/checks.hpp"

#include <algorithm>
#include <filesystem>

#include "common/strings.hpp"
#include "gpu/selector.hpp"

namespace gpufence {

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

}  // namespace

std::optional<std::set<unsigned>> allocated_minors(const Snapshot& s, const NodeContainer& c) {
  if (!s.allocations || c.pod.empty()) return std::nullopt;
  for (const auto& a : *s.allocations) {
    if (a.pod_namespace != c.pod_namespace || a.pod != c.pod || a.container != c.name) continue;
    std::set<unsigned> out;
    for (const auto& id : a.device_ids) {
      auto token = parse_device_token(id);
      if (!token) continue;
      auto gpus = resolve_token(*token, inventory(s));
      if (gpus)
        for (const auto& g : *gpus) out.insert(g.minor);
    }
    return out;
  }
  return std::set<unsigned>{};  // known to the kubelet's view: allocated nothing
}

const std::vector<std::string>& doctor_check_ids() {
  static const std::vector<std::string> ids = {"gpu.open-unallocated",
                                               "gpu.privileged-open-unallocated",
                                               "gpu.no-request-can-open",
                                               "gpu.process-on-unallocated",
                                               "gpu.shared",
                                               "env.visible-devices-mismatch",
                                               "node.gpu-capacity",
                                               "node.gpu-not-allocatable",
                                               "deepstream.gpu-id-invisible",
                                               "pod.runtimeclass-missing",
                                               "pod.no-gpu-runtime",
                                               "pod.env-visible-devices",
                                               "containerd.*"};
  return ids;
}

std::vector<Finding> judge(const Snapshot& s) {
  std::vector<Finding> out;
  const auto inv = inventory(s);

  for (const auto& c : s.containers) {
    auto allocated = allocated_minors(s, c);
    // What it can reach: its cgroup's answer where known, else the nodes in its /dev.
    std::set<unsigned> reach = c.openable ? *c.openable : std::set<unsigned>{};
    std::string reach_how = c.openable ? c.openable_source : "unknown";

    if (allocated && c.openable) {
      std::set<unsigned> extra;
      std::set_difference(reach.begin(), reach.end(), allocated->begin(), allocated->end(),
                          std::inserter(extra, extra.end()));
      if (!extra.empty()) {
        std::string evidence =
            cat(c.label(), ": kubelet allocated ", gpu_names(s, *allocated),
                "; its devices cgroup (", reach_how, ") lets it open ", gpu_names(s, reach),
                "; nodes in its /dev: ", gpu_names(s, c.gpu_nodes_present),
                c.privileged ? "; privileged (CAP_SYS_ADMIN)" : "");
        if (allocated->empty()) {
          out.push_back(
              {"gpu.no-request-can-open", Severity::error,
               cat("container ", c.label(), " requested no GPU but can open ", gpu_names(s, extra)),
               evidence + (c.nvidia_visible_devices
                               ? "; NVIDIA_VISIBLE_DEVICES=" + *c.nvidia_visible_devices
                               : ""),
               cat(kFixRuntime,
                   " (gpufence-runtime gives a container with no allocation no GPU, and ignores an "
                   "image's NVIDIA_VISIBLE_DEVICES=all)")});
        } else if (c.privileged) {
          out.push_back({"gpu.privileged-open-unallocated", Severity::error,
                         cat("privileged container ", c.label(), " holds ", gpu_names(s, extra),
                             " it was not allocated"),
                         evidence,
                         cat(kFixRuntime,
                             " (it denies unallocated GPUs even to privileged containers), or drop "
                             "privileged: true")});
        } else {
          out.push_back({"gpu.open-unallocated", Severity::error,
                         cat("container ", c.label(), " can open ", gpu_names(s, extra),
                             " it was not allocated"),
                         evidence, kFixRuntime});
        }
      }
    }

    if (allocated) {
      auto used = used_minors(s, c);
      std::set<unsigned> wrong;
      std::set_difference(used.begin(), used.end(), allocated->begin(), allocated->end(),
                          std::inserter(wrong, wrong.end()));
      if (!wrong.empty()) {
        std::vector<std::string> pids;
        for (const auto& g : s.gpus) {
          if (!wrong.contains(g.gpu.minor)) continue;
          for (const auto& p : g.processes) {
            if (container_of_pid(s, p.pid) == &c)
              pids.push_back(cat(p.pid, " on GPU ", g.gpu.index));
          }
        }
        out.push_back(
            {"gpu.process-on-unallocated", Severity::error,
             cat("container ", c.label(), " was allocated ", gpu_names(s, *allocated),
                 " but its processes run on ", gpu_names(s, wrong)),
             cat("NVML processes: ", join(pids, ", "),
                 "; CUDA_VISIBLE_DEVICES=", c.cuda_visible_devices.value_or("(unset)"),
                 "; NVIDIA_VISIBLE_DEVICES=", c.nvidia_visible_devices.value_or("(unset)")),
             "set CUDA_VISIBLE_DEVICES to the allocated UUID (gpufence-device-plugin and "
             "gpufence-runtime do), "
             "and set the app's gpu-id to 0: it counts the GPUs the container sees, not the "
             "node's (`gpufence launch --config <ds config> -- <app>` does both)"});
      }

      // The env should name exactly the allocation (or defer to mount markers).
      if (c.nvidia_visible_devices && !allocated->empty()) {
        auto sel = parse_device_selector(*c.nvidia_visible_devices);
        if (sel && sel->kind != DeviceSelector::Kind::volume_mounts) {
          auto named = resolve_selector(*sel, inv);
          std::set<unsigned> named_minors = named ? minors_of(*named) : std::set<unsigned>{};
          if (!named || named_minors != *allocated) {
            out.push_back(
                {"env.visible-devices-mismatch", Severity::warning,
                 cat("container ", c.label(),
                     ": NVIDIA_VISIBLE_DEVICES=", *c.nvidia_visible_devices,
                     " does not match the kubelet's allocation ", gpu_names(s, *allocated)),
                 cat("environment of PID ", c.pids.empty() ? 0 : c.pids.front(),
                     named ? "" : "; " + named.error().message),
                 "do not set NVIDIA_VISIBLE_DEVICES in the image or pod spec; the device plugin's "
                 "Allocate answer sets it"});
          }
        }
      }
    }

    // DeepStream gpu-id keys index the GPUs CUDA shows the container.
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
      }
    }
  }

  // Two containers on one GPU.
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

  // The API server's view: GPU pods and the runtime that enforces their allocation.
  if (s.kube) {
    std::string default_bin = s.containerd_default_binary;
    std::string base =
        default_bin.empty() ? "" : std::filesystem::path(default_bin).filename().string();
    bool default_enforces =
        base == "gpufence-runtime" || base.starts_with("nvidia-container-runtime");
    for (const auto& pod : s.kube->pods) {
      if (pod.gpus <= 0) continue;
      std::string label = cat(pod.pod_namespace, "/", pod.name);
      if (!pod.runtime_class.empty() && !s.kube->runtime_classes.contains(pod.runtime_class)) {
        out.push_back({"pod.runtimeclass-missing", Severity::error,
                       cat("pod ", label, " names RuntimeClass '", pod.runtime_class, "', which does not exist"),
                       cat("spec.runtimeClassName = ", pod.runtime_class, "; RuntimeClasses: ",
                           s.kube->runtime_classes.empty() ? std::string("none") : [&] {
                             std::vector<std::string> n;
                             for (const auto& [k, v] : s.kube->runtime_classes) n.push_back(k);
                             return join(n, ", ");
                           }()),
                       "kubectl apply -f deploy/kubernetes/runtimeclass.yaml (handler nvidia), and run "
                       "`gpufence setup containerd --runtime-name nvidia` on the node"});
      }
      if (pod.runtime_class.empty() && !default_enforces) {
        out.push_back(
            {"pod.no-gpu-runtime", pod.privileged ? Severity::error : Severity::warning,
             cat("GPU pod ", label,
                 " has no runtimeClassName and containerd's default runtime does not "
                 "enforce GPU allocation",
                 pod.privileged ? " (privileged: it sees every GPU)" : ""),
             cat("requests ", pod.gpus, " ", s.resource_name, "; containerd default runtime runs ",
                 default_bin.empty() ? std::string("plain runc") : default_bin),
             "set runtimeClassName: nvidia in the pod spec (and `gpufence setup containerd`), or "
             "make "
             "the gpufence handler the default: `gpufence setup containerd --set-as-default`"});
      }
      for (const auto& env : pod.env_visible_devices) {
        out.push_back({"pod.env-visible-devices", Severity::warning,
                       cat("pod ", label, " sets NVIDIA_VISIBLE_DEVICES in its spec (", env, ")"),
                       cat("pod spec container ", env),
                       "remove it: the device plugin's Allocate answer sets the allocation; a "
                       "pod-set value is "
                       "either ignored or, with env-trusting runtimes, grants GPUs the kubelet "
                       "never allocated"});
      }
    }
    if (s.kube->capacity && !s.gpus.empty() &&
        (*s.kube->capacity == 0 || *s.kube->capacity < static_cast<long>(s.gpus.size()))) {
      out.push_back(
          {"node.gpu-capacity", Severity::error,
           cat("the node advertises ", *s.kube->capacity, " ", s.resource_name, " but ",
               s.gpus.size(), " GPU(s) are present"),
           cat("node status capacity ", s.resource_name, "=", *s.kube->capacity,
               ", allocatable=", s.kube->allocatable.value_or(0), "; device plugin sockets: ",
               s.plugin_sockets.empty() ? std::string("none") : join(s.plugin_sockets, ", ")),
           "the device plugin is not registered (what keeps GPU Operator's validator at Init:3/4): "
           "run "
           "gpufence-device-plugin (deploy/kubernetes/device-plugin.yaml) with the kubelet's "
           "plugin "
           "directory"});
    }
  }

  // What the kubelet can hand out, against the GPUs present (when the API did not already say).
  bool capacity_judged = s.kube && s.kube->capacity;
  if (!capacity_judged && s.allocatable && !s.gpus.empty()) {
    if (s.allocatable->empty()) {
      out.push_back(
          {"node.gpu-capacity", Severity::error,
           cat("the kubelet has no allocatable ", s.resource_name, " although ", s.gpus.size(),
               " GPU(s) are present"),
           cat("PodResources GetAllocatableResources lists no ", s.resource_name,
               " devices; device plugin sockets: ",
               s.plugin_sockets.empty() ? std::string("none") : join(s.plugin_sockets, ", ")),
           "the device plugin is not registered (what keeps GPU Operator's validator at Init:3/4): "
           "run "
           "gpufence-device-plugin (deploy/kubernetes/device-plugin.yaml) with the kubelet's "
           "plugin directory"});
    } else if (s.allocatable->size() < s.gpus.size()) {
      std::vector<std::string> missing;
      for (const auto& g : s.gpus) {
        bool listed =
            std::any_of(s.allocatable->begin(), s.allocatable->end(), [&](const std::string& id) {
              return id == g.gpu.uuid || id == std::to_string(g.gpu.index);
            });
        if (!listed) missing.push_back(cat("GPU ", g.gpu.index, " (", g.gpu.uuid, ")"));
      }
      out.push_back(
          {"node.gpu-not-allocatable", Severity::warning,
           cat(join(missing, ", "),
               " present but not allocatable by the kubelet (unhealthy or not advertised)"),
           cat("allocatable: ", join(*s.allocatable, ", ")),
           "check the device plugin's log for health events (XIDs) on those GPUs"});
    }
  }

  for (const auto& f : s.containerd_findings) out.push_back(f);
  std::stable_sort(out.begin(), out.end(),
                   [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
  return out;
}

}  // namespace gpufence
