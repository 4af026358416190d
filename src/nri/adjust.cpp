#include "nri/adjust.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <unistd.h>

#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/device_rules.hpp"

namespace gpufence::nri {
namespace {

Json hook_json(const api::Hook& h) {
  Json j = Json::object();
  j["path"] = h.path();
  if (h.args_size() > 0)
    j["args"] = Json(std::vector<std::string>(h.args().begin(), h.args().end()));
  if (h.env_size() > 0) j["env"] = Json(std::vector<std::string>(h.env().begin(), h.env().end()));
  if (h.has_timeout()) j["timeout"] = h.timeout().value();
  return j;
}

void hooks_json(Json& spec, const api::Hooks& hooks) {
  const std::pair<const char*, const google::protobuf::RepeatedPtrField<api::Hook>*> lists[] = {
      {"prestart", &hooks.prestart()},
      {"createRuntime", &hooks.create_runtime()},
      {"createContainer", &hooks.create_container()},
      {"startContainer", &hooks.start_container()},
      {"poststart", &hooks.poststart()},
      {"poststop", &hooks.poststop()}};
  for (const auto& [name, list] : lists) {
    if (list->empty()) continue;
    Json& out = ensure_array(ensure_object(spec, "hooks"), name);
    for (const auto& h : *list) out.push_back(hook_json(h));
  }
}

std::vector<std::pair<std::string, std::string>> env_pairs(const Json& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  auto p = spec.find("process");
  if (p == spec.end() || !p->contains("env")) return out;
  for (const auto& e : (*p)["env"]) {
    const std::string& kv = e.get_ref<const std::string&>();
    auto eq = kv.find('=');
    out.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
  }
  return out;
}

const Json& list_at(const Json& spec, std::initializer_list<const char*> path) {
  static const Json empty = Json::array();
  const Json* at = &spec;
  for (const char* key : path) {
    auto it = at->find(key);
    if (it == at->end()) return empty;
    at = &*it;
  }
  return at->is_array() ? *at : empty;
}

// Each item of a list by its `key` field, the first of equal ones (as a linear search finds it):
// a lookup per item keeps a diff linear in the list's length.
class IndexBy {
 public:
  IndexBy(const Json& list, const char* key) {
    m_items.reserve(list.size());
    for (const auto& item : list) {
      auto it = item.find(key);
      if (it != item.end() && it->is_string())
        m_items.emplace(it->get_ref<const std::string&>(), &item);
      else
        m_items.emplace(std::string_view(), &item);
    }
  }
  const Json* find(std::string_view value) const {
    auto it = m_items.find(value);
    return it == m_items.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<std::string_view, const Json*> m_items;
};

std::string_view string_at(const Json& item, const char* key) {
  auto it = item.find(key);
  return it != item.end() && it->is_string() ? std::string_view(it->get_ref<const std::string&>())
                                             : std::string_view();
}

api::LinuxDevice device_message(const Json& d) {
  api::LinuxDevice out;
  out.set_path(d.value("path", ""));
  out.set_type(d.value("type", ""));
  out.set_major(d.value("major", int64_t{0}));
  out.set_minor(d.value("minor", int64_t{0}));
  if (d.contains("fileMode")) out.mutable_file_mode()->set_value(d["fileMode"].get<uint32_t>());
  if (d.contains("uid")) out.mutable_uid()->set_value(d["uid"].get<uint32_t>());
  if (d.contains("gid")) out.mutable_gid()->set_value(d["gid"].get<uint32_t>());
  return out;
}

api::Mount mount_message(const Json& m) {
  api::Mount out;
  out.set_destination(m.value("destination", ""));
  out.set_type(m.value("type", ""));
  out.set_source(m.value("source", ""));
  for (const auto& o : list_at(m, {"options"})) out.add_options(o.get<std::string>());
  return out;
}

api::LinuxDeviceCgroup rule_message(const DeviceRule& r) {
  api::LinuxDeviceCgroup out;
  out.set_allow(r.allow);
  out.set_type(std::string(1, r.type));
  if (r.major) out.mutable_major()->set_value(*r.major);
  if (r.minor) out.mutable_minor()->set_value(*r.minor);
  out.set_access(r.access);
  return out;
}

api::Hook hook_message(const Json& h) {
  api::Hook out;
  out.set_path(h.value("path", ""));
  for (const auto& a : list_at(h, {"args"})) out.add_args(a.get<std::string>());
  for (const auto& e : list_at(h, {"env"})) out.add_env(e.get<std::string>());
  if (h.contains("timeout") && !h["timeout"].is_null())
    out.mutable_timeout()->set_value(h["timeout"].get<int64_t>());
  return out;
}

// The fields of a spec this translation reads and writes; any other difference the edit made
// cannot be carried to containerd and refuses the container.
Json without_carried_fields(Json spec) {
  spec.erase("annotations");
  spec.erase("mounts");
  spec.erase("hooks");
  if (auto p = spec.find("process"); p != spec.end()) {
    p->erase("env");
    if (p->empty()) spec.erase("process");
  }
  if (auto l = spec.find("linux"); l != spec.end()) {
    l->erase("devices");
    if (auto r = l->find("resources"); r != l->end()) {
      r->erase("devices");
      if (r->empty()) l->erase("resources");
    }
    if (l->empty()) spec.erase("linux");
  }
  return spec;
}

// Step: env set by name (NRI replaces K= in place, appends new ones: generate.go AdjustEnv).
void diff_env(const Json& before, const Json& after, api::ContainerAdjustment& adjust,
              std::vector<std::string>& gaps) {
  auto old_env = env_pairs(before);
  auto new_env = env_pairs(after);
  std::map<std::string, std::string> old_map(old_env.begin(), old_env.end());
  std::map<std::string, std::string> new_map(new_env.begin(), new_env.end());
  for (const auto& [k, v] : new_map) {
    auto it = old_map.find(k);
    if (it != old_map.end() && it->second == v) continue;
    auto* kv = adjust.add_env();
    kv->set_key(k);
    kv->set_value(v);
  }
  for (const auto& [k, v] : old_map) {
    if (new_map.contains(k)) continue;
    adjust.add_env()->set_key("-" + k);
    gaps.push_back(cat("env ", k, " stays (NRI does not forward an env removal)"));
  }
}

// Step: device nodes by path; a node the edit took out can only be denied by the rules.
std::vector<std::string> diff_devices(const Json& before, const Json& after,
                                      api::ContainerAdjustment& adjust) {
  const Json& old_devs = list_at(before, {"linux", "devices"});
  const Json& new_devs = list_at(after, {"linux", "devices"});
  const IndexBy old_by_path(old_devs, "path"), new_by_path(new_devs, "path");
  std::vector<std::string> removed;
  for (const auto& d : new_devs) {
    const Json* was = old_by_path.find(string_at(d, "path"));
    if (was && *was == d) continue;
    *adjust.mutable_linux()->add_devices() = device_message(d);
  }
  for (const auto& d : old_devs) {
    std::string path(string_at(d, "path"));
    if (new_by_path.find(path)) continue;
    adjust.mutable_linux()->add_devices()->set_path("-" + path);
    removed.push_back(path);
  }
  return removed;
}

void diff_mounts(const Json& before, const Json& after, api::ContainerAdjustment& adjust) {
  const Json& old_mounts = list_at(before, {"mounts"});
  const Json& new_mounts = list_at(after, {"mounts"});
  const IndexBy old_by_dest(old_mounts, "destination"), new_by_dest(new_mounts, "destination");
  for (const auto& m : new_mounts) {
    const Json* was = old_by_dest.find(string_at(m, "destination"));
    if (was && *was == m) continue;
    *adjust.add_mounts() = mount_message(m);
  }
  for (const auto& m : old_mounts) {
    std::string_view dest = string_at(m, "destination");
    if (!new_by_dest.find(dest)) adjust.add_mounts()->set_destination(cat("-", dest));
  }
}

// Step: hooks the edit appended; an edit of an existing hook cannot be carried.
Status diff_hooks(const Json& before, const Json& after, api::ContainerAdjustment& adjust) {
  const std::pair<const char*, google::protobuf::RepeatedPtrField<api::Hook>* (api::Hooks::*)()>
      lists[] = {{"prestart", &api::Hooks::mutable_prestart},
                 {"createRuntime", &api::Hooks::mutable_create_runtime},
                 {"createContainer", &api::Hooks::mutable_create_container},
                 {"startContainer", &api::Hooks::mutable_start_container},
                 {"poststart", &api::Hooks::mutable_poststart},
                 {"poststop", &api::Hooks::mutable_poststop}};
  for (const auto& [name, field] : lists) {
    const Json& old_list = list_at(before, {"hooks", name});
    const Json& new_list = list_at(after, {"hooks", name});
    for (size_t i = 0; i < old_list.size(); ++i) {
      if (i >= new_list.size() || new_list[i] != old_list[i])
        return fail(Errc::denied, "the ", name, " hook ",
                    escape_text(old_list[i].value("path", "")),
                    " runs without a fixed environment or time limit, and NRI cannot change a "
                    "hook the runtime added");
    }
    for (size_t i = old_list.size(); i < new_list.size(); ++i)
      *((adjust.mutable_hooks()->*field)()->Add()) = hook_message(new_list[i]);
  }
  return {};
}

// Whether `after` takes any access away that `before` gave, probed at every device number either
// list names (and at the wildcard of each major): adding allows, as NRI does itself for the nodes
// an adjustment adds, is not narrowing.
bool rules_narrowed(const std::vector<DeviceRule>& before, const std::vector<DeviceRule>& after) {
  std::set<std::tuple<char, std::optional<unsigned>, std::optional<unsigned>>> probes;
  for (const auto* list : {&before, &after})
    for (const auto& r : *list)
      for (char t : {'c', 'b'})
        if (r.type == 'a' || r.type == t) {
          probes.emplace(t, r.major, r.minor);
          probes.emplace(t, r.major, std::nullopt);
        }
  for (unsigned major : {unsigned{kNvidiaMajor}, unsigned{kDrmMajor}})
    probes.emplace('c', major, std::nullopt);
  for (const auto& [type, major, minor] : probes) {
    std::string was = effective_access(before, type, major, minor);
    std::string now = effective_access(after, type, major, minor);
    for (char bit : was)
      if (now.find(bit) == std::string::npos) return true;
  }
  return false;
}

}  // namespace

Status check_request_limits(const api::PodSandbox& pod, const api::Container& container,
                            const RequestLimits& limits) {
  auto over = [](std::string_view what, size_t n, size_t limit) -> Status {
    return fail(Errc::denied, "the container has ", n, " ", what,
                ", above gpufence-nri's limit of ", limit, " (docs/nri.md, \"Limits\")");
  };
  const auto& c = container;
  if (size_t n = c.mounts_size(); n > limits.mounts) return over("mounts", n, limits.mounts);
  if (size_t n = c.linux().devices_size(); n > limits.devices)
    return over("device nodes", n, limits.devices);
  if (size_t n = c.linux().resources().devices_size(); n > limits.device_rules)
    return over("device cgroup rules", n, limits.device_rules);
  if (size_t n = c.env_size(); n > limits.env) return over("env entries", n, limits.env);
  const auto& h = c.hooks();
  size_t hooks = h.prestart_size() + h.create_runtime_size() + h.create_container_size() +
                 h.start_container_size() + h.poststart_size() + h.poststop_size();
  if (hooks > limits.hooks) return over("hooks", hooks, limits.hooks);
  size_t annotation_bytes = 0;
  for (const auto* map : {&pod.annotations(), &c.annotations()})
    for (const auto& [k, v] : *map) annotation_bytes += k.size() + v.size();
  if (annotation_bytes > limits.annotation_bytes)
    return over("bytes of annotations (the pod's and its own)", annotation_bytes,
                limits.annotation_bytes);
  auto long_path = [&](std::string_view what, const std::string& path) -> Status {
    if (path.size() <= limits.path_bytes) return {};
    return fail(Errc::denied, what, " ", escape_excerpt(path), " is longer than ",
                limits.path_bytes, " bytes (PATH_MAX)");
  };
  for (const auto& m : c.mounts()) {
    if (auto st = long_path("mount destination", m.destination()); !st) return st;
    if (auto st = long_path("mount source", m.source()); !st) return st;
  }
  for (const auto& d : c.linux().devices())
    if (auto st = long_path("device", d.path()); !st) return st;
  return {};
}

Status refuse_shared_trusted_annotations(const api::PodSandbox& pod,
                                         const api::Container& container,
                                         const std::vector<std::string>& trusted_prefixes) {
  for (const auto& [key, value] : container.annotations()) {
    if (!pod.annotations().contains(key)) continue;
    bool read = key == kDecidedAnnotation ||
                std::any_of(trusted_prefixes.begin(), trusted_prefixes.end(),
                            [&](const std::string& p) { return key.starts_with(p); });
    if (read)
      return fail(Errc::denied, "annotation ", escape_excerpt(key),
                  " is set on the pod and on the container: a pod annotation containerd copied "
                  "into the container (pod_annotations) cannot be told from the device plugin's");
  }
  return {};
}

Json container_spec(const api::PodSandbox& pod, const api::Container& container) {
  Json spec = Json::object();
  Json annotations = Json::object();
  for (const auto& [k, v] : container.annotations())
    if (!pod.annotations().contains(k)) annotations[k] = v;
  std::vector<std::string> cdi;
  for (const auto& d : container.cdi_devices()) cdi.push_back(d.name());
  if (!cdi.empty()) annotations[std::string(kCriCdiDevicesAnnotation)] = join(cdi, ",");
  spec["annotations"] = annotations;
  Json env = Json::array();
  for (const auto& e : container.env()) env.push_back(e);
  spec["process"] = {{"env", env}};
  Json mounts = Json::array();
  for (const auto& m : container.mounts()) {
    Json j = {{"destination", m.destination()}, {"type", m.type()}, {"source", m.source()}};
    j["options"] = Json(std::vector<std::string>(m.options().begin(), m.options().end()));
    mounts.push_back(j);
  }
  spec["mounts"] = mounts;
  if (container.has_hooks()) hooks_json(spec, container.hooks());
  Json devices = Json::array();
  for (const auto& d : container.linux().devices()) {
    Json j = {{"path", d.path()}, {"type", d.type()}, {"major", d.major()}, {"minor", d.minor()}};
    if (d.has_file_mode()) j["fileMode"] = d.file_mode().value();
    if (d.has_uid()) j["uid"] = d.uid().value();
    if (d.has_gid()) j["gid"] = d.gid().value();
    devices.push_back(j);
  }
  Json rules = Json::array();
  for (const auto& r : container.linux().resources().devices()) {
    Json j = {{"allow", r.allow()}, {"type", r.type()}};
    if (r.has_major()) j["major"] = r.major().value();
    if (r.has_minor()) j["minor"] = r.minor().value();
    j["access"] = r.access();
    rules.push_back(j);
  }
  spec["linux"] = {{"devices", devices}, {"resources", {{"devices", rules}}}};
  return spec;
}

Result<NriDecision> decide_container(const api::PodSandbox& pod, const api::Container& container,
                                     const RuntimeInfo& runtime, ShimContext& ctx,
                                     std::optional<SteadyTime> deadline) {
  NriDecision out;
  out.shim.container_id = container.id();
  const std::string where = cat("container ", escape_excerpt(container.name()), " of pod ",
                                escape_excerpt(pod.namespace_()), "/", escape_excerpt(pod.name()));
  // Between steps: a decision past its budget stops and frees what it holds (its answer would
  // come after the runtime gave up on it).
  auto out_of_time = [&](std::string_view step) -> Status {
    if (!deadline || std::chrono::steady_clock::now() < *deadline) return {};
    return fail(Errc::denied, where, ": no decision within the budget (stopped before ", step, ")");
  };

  // 0. Bounded before anything is copied, and no trusted key the pod also sets.
  if (auto st = check_request_limits(pod, container); !st)
    return std::unexpected(st.error().wrap(where));
  if (auto st = refuse_shared_trusted_annotations(pod, container, ctx.config.annotation_prefixes);
      !st)
    return std::unexpected(st.error().wrap(where));

  // 0b. gpufence's own node agents (runtime.toml [nri] node_agent_namespaces): left as containerd
  //     made them, marked decided. The namespace is the kubelet's, from the API server.
  const auto& agents = ctx.config.nri_node_agent_namespaces;
  if (std::find(agents.begin(), agents.end(), pod.namespace_()) != agents.end()) {
    out.node_agent = true;
    (*out.adjust.mutable_annotations())[std::string(kDecidedAnnotation)] = container.id();
    return out;
  }

  // 1. The spec as the shim would read it. A device rule or node of a type NRI cannot mean
  //    (containerd builds these from the OCI spec) is refused as the shim refuses it.
  const Json before = container_spec(pod, container);
  if (auto st = check_spec_fields(before); !st) return std::unexpected(st.error().wrap(where));
  auto before_rules = parse_spec_device_rules(before);
  if (!before_rules) return std::unexpected(before_rules.error().wrap(where));

  // 2. The shim's decision and edit.
  if (auto st = out_of_time("the isolation edit"); !st) return std::unexpected(st.error());
  Json after = before;
  auto changed = edit_spec(after, ctx, out.shim, where);
  if (!changed)
    return std::unexpected(
        changed.error().message.starts_with(where) ? changed.error() : changed.error().wrap(where));
  out.rules = "unchanged";
  const auto mark = [&] {
    (*out.adjust.mutable_annotations())[std::string(kDecidedAnnotation)] = container.id();
  };
  if (!*changed) {
    mark();
    return out;
  }

  // 3. The edit as an adjustment.
  out.edited = true;
  if (auto st = out_of_time("the adjustment"); !st) return std::unexpected(st.error());
  if (without_carried_fields(before) != without_carried_fields(after))
    return fail(Errc::internal, where, ": the isolation edit changed a field NRI cannot adjust");
  diff_env(before, after, out.adjust, out.gaps);
  auto removed = diff_devices(before, after, out.adjust);
  diff_mounts(before, after, out.adjust);
  if (auto st = diff_hooks(before, after, out.adjust); !st)
    return std::unexpected(st.error().wrap(where));
  if (before.value("annotations", Json::object()) != after.value("annotations", Json::object()))
    return fail(Errc::internal, where, ": the isolation edit changed annotations");

  // 4. Device cgroup rules: "deny all" then the shim's list, appended after the runtime's own
  //    (and after the allow rules NRI adds for the nodes above), so the appended list decides.
  auto after_rules = parse_spec_device_rules(after);
  if (!after_rules) return std::unexpected(after_rules.error().wrap(where));
  bool rules_changed = *after_rules != *before_rules;
  if (rules_changed && runtime.device_rules) {
    auto* list = out.adjust.mutable_linux()->mutable_resources()->mutable_devices();
    *list->Add() = rule_message(DeviceRule{false, 'a', std::nullopt, std::nullopt, "rwm"});
    for (const auto& r : *after_rules) *list->Add() = rule_message(r);
    out.rules = "appended";
  } else if (rules_changed) {
    out.rules = "not-applied";
  }

  // 5. What could not be carried. Without rules a removed node or narrowed rule stays: refused
  //    for an unprivileged container (it would keep a GPU it was not given), logged as the gap
  //    for a privileged one (docs/nri.md: pair it with the shim there).
  bool narrowed =
      !removed.empty() || (rules_changed && rules_narrowed(*before_rules, *after_rules));
  if (narrowed && !runtime.device_rules) {
    std::string gap = cat("NRI ", runtime.nri_text(), " (", runtime.name, " ", runtime.version,
                          ") applies no device cgroup rules: ",
                          removed.empty() ? std::string("the device rules")
                                          : cat("nodes ", join(removed, ","), " and the rules"),
                          " stay as the runtime made them");
    if (!out.shim.admits_all_devices) return fail(Errc::denied, where, ": ", gap);
    out.gaps.push_back(gap);
  }

  // 6. The mark the fence checks and a later Synchronize reads (judge_synchronized).
  mark();
  return out;
}

namespace {

// Decided by gpufence-nri: its mark holds this container's id, which containerd generated after
// the pod was written (no pod annotation can carry it).
bool carries_decision(const api::Container& c) {
  auto it = c.annotations().find(std::string(kDecidedAnnotation));
  return it != c.annotations().end() && !c.id().empty() && it->second == c.id();
}

// What a decision would change as far as GPUs go; "" when nothing.
std::string gpu_effect(const NriDecision& d) {
  std::vector<std::string> parts;
  if (!d.shim.granted.empty()) parts.push_back(cat("grant ", join(d.shim.granted, ",")));
  if (!d.shim.removed_nodes.empty())
    parts.push_back(cat("take away ", join(d.shim.removed_nodes, ",")));
  if (d.rules != "unchanged")
    parts.push_back(d.shim.admits_all_devices ? "narrow its allow-all device rules to its GPUs"
                                              : "narrow its device rules");
  return join(parts, "; ");
}

}  // namespace

SyncJudgement judge_synchronized(const std::vector<api::PodSandbox>& pods,
                                 const std::vector<api::Container>& containers,
                                 const RuntimeInfo& runtime, ShimContext& ctx,
                                 std::chrono::milliseconds budget) {
  SyncJudgement out;
  std::map<std::string, const api::PodSandbox*> by_id;
  for (const auto& p : pods) by_id[p.id()] = &p;
  const api::PodSandbox none;
  for (const auto& c : containers) {
    ++out.containers;
    if (c.state() == api::CONTAINER_STOPPED) continue;
    auto it = by_id.find(c.pod_sandbox_id());
    const api::PodSandbox* pod = it == by_id.end() ? nullptr : it->second;
    if (carries_decision(c)) continue;
    UnenforcedContainer u{c.id(), pod ? cat(pod->namespace_(), "/", pod->name()) : std::string(),
                          c.name(), pod ? pod->runtime_handler() : std::string(), ""};
    std::optional<SteadyTime> deadline;
    if (budget.count() > 0) deadline = std::chrono::steady_clock::now() + budget;
    Result<NriDecision> d = fail(Errc::internal, "no decision");
    try {
      d = decide_container(pod ? *pod : none, c, runtime, ctx, deadline);
    } catch (const std::exception& e) {
      d = fail(Errc::internal, "the decision failed: ", e.what());
    }
    if (!d && deadline && std::chrono::steady_clock::now() >= *deadline) {
      u.why = cat("created without gpufence-nri; not judged (too slow: over ", budget.count(),
                  " ms), so what it can open is unknown");
    } else if (!d) {
      u.why = cat("created without gpufence-nri; it would have been refused: ", d.error().message);
    } else if (std::string effect = gpu_effect(*d); !effect.empty()) {
      u.why = cat("created without gpufence-nri, which would ", effect);
    } else {
      if (d->edited) ++out.without_gpu_edit;
      continue;
    }
    out.unenforced.push_back(std::move(u));
  }
  return out;
}

}  // namespace gpufence::nri
