// install's steps, each a function that reports itself (install/flow.hpp).
#include "install/flow.hpp"

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "containerd/setup.hpp"
#include "install/default_runtime_toml.hpp"
#include "install/lock.hpp"
#include "install/state.hpp"

namespace gpufence::install_flow {

// Step: which distribution, and so which config, socket and restart command.
bool find_layout(Run& r) {
  Distribution d;
  if (r.opt.distribution) {
    d = *r.opt.distribution;
  } else {
    auto detected = detect_distribution(r.env.host, r.report.notes);
    if (!detected) return r.failed("distribution", detected.error().message);
    d = *detected;
  }
  const DistributionRow& row = distribution_row(d);
  r.layout = layout_for(d, r.env.host);
  if (!r.opt.config_path.empty())
    r.layout.config_path = r.opt.config_path;
  else if (row.config_source == ConfigSource::go_template)
    r.layout.config_path.clear();  // the planner picks the template this node's k3s renders
  if (!r.opt.socket.empty()) r.layout.socket = r.opt.socket;
  if (!r.opt.restart_command.empty()) r.layout.restart = r.opt.restart_command;
  r.report.distribution = std::string(distribution_name(d));
  r.report.config_path = r.layout.config_path;
  r.report.socket = r.layout.socket;
  r.step("distribution", Outcome::unchanged,
         cat(distribution_name(d), ": config ",
             r.layout.config_path.empty() ? std::string("the template k3s renders")
                                          : r.layout.config_path,
             ", socket ", r.layout.socket));
  return true;
}

// Step: gpufence-runtime at its stable path, swapped in atomically.
bool put_binary(Run& r) {
  auto done = install_binary(r.env.host, r.opt.binary);
  if (!done) return r.failed("runtime binary", done.error().message);
  r.binary_target = done->target;
  r.step("runtime binary", done->changed == Changed::yes ? Outcome::changed : Outcome::unchanged,
         cat(r.opt.binary.link, " -> ", done->target));
  for (const auto& p : done->pruned) r.report.notes.push_back("removed old version " + p);
  return true;
}

// Step: the copied shim must start on the host (its glibc, its loader) before containerd is
// told to exec it for every GPU container: `gpufence-runtime --gpufence-help` touches nothing.
bool smoke_test_binary(Run& r) {
  // In the host's namespaces the stable link itself; run from here, the file it names (the
  // link's absolute target means nothing under a host root that is not "/").
  std::string path = r.opt.host_exec == HostExec::nsenter
                         ? r.opt.binary.link
                         : r.env.host.resolve(r.binary_target).string();
  auto argv = host_command(r.opt.host_exec, {path, "--gpufence-help"}, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return r.failed("runtime binary", res.error().message);
  if (res->exit_code != 0)
    return r.failed(
        "runtime binary",
        cat(r.opt.binary.link, " does not run on this host (`", shell_words(argv), "` exited ",
            res->exit_code, ": ", trim(res->out), "); containerd's config is left as it was"));
  return true;
}

// ---- install: the steps ----

// A Kubernetes namespace name (RFC 1123 label).
bool is_namespace_name(std::string_view s) {
  return !s.empty() && s.size() <= 63 && s.front() != '-' && s.back() != '-' &&
         std::ranges::all_of(s, [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
         });
}

// deploy/runtime.toml, with the driver's NVML named when it is not on the host's library path.
Result<std::string> runtime_config_text(const std::string& nvml_library,
                                        const std::string& node_agent_namespace,
                                        const std::vector<std::string>& gpu_cdi_kinds) {
  std::string text(kDefaultRuntimeToml);
  if (!gpu_cdi_kinds.empty()) {
    // CDI kinds are vendor/class of [A-Za-z0-9._-] (the CLI checks the grammar): nothing a TOML
    // basic string would need to escape.
    std::string list;
    for (const auto& kind : gpu_cdi_kinds) {
      bool plain = !kind.empty() && std::ranges::all_of(kind, [](unsigned char c) {
        return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/';
      });
      if (!plain)
        return fail(Errc::invalid_argument, "the CDI kind '", escape_excerpt(kind),
                    "' is not vendor/class");
      list += cat(list.empty() ? "" : ", ", "\"", kind, "\"");
    }
    constexpr std::string_view key = "\ngpu_kinds = []\n";
    auto at = text.find(key);
    if (at == std::string::npos)
      return fail(Errc::internal, "deploy/runtime.toml has no empty gpu_kinds line");
    text.replace(at, key.size(), cat("\ngpu_kinds = [", list, "]\n"));
  }
  if (!node_agent_namespace.empty()) {
    if (!is_namespace_name(node_agent_namespace))
      return fail(Errc::invalid_argument, "the node agent namespace '",
                  escape_excerpt(node_agent_namespace), "' is not a Kubernetes namespace name");
    constexpr std::string_view key = "\nnode_agent_namespaces = []\n";
    auto at = text.find(key);
    if (at == std::string::npos)
      return fail(Errc::internal, "deploy/runtime.toml has no empty node_agent_namespaces line");
    text.replace(at, key.size(),
                 cat("\nnode_agent_namespaces = [\"", node_agent_namespace, "\"]\n"));
  }
  if (nvml_library.empty()) return text;
  if (!nvml_library.starts_with("/") || std::ranges::any_of(nvml_library, [](unsigned char c) {
        return c < 0x20 || c == '"' || c == '\\' || c == 0x7f;
      }))
    return fail(Errc::invalid_argument, "the NVML library path '", escape_excerpt(nvml_library),
                "' is not an absolute path a TOML basic string holds as is");
  constexpr std::string_view key = "\nnvml_library = \"\"\n";
  auto at = text.find(key);
  if (at == std::string::npos)
    return fail(Errc::internal, "deploy/runtime.toml has no empty nvml_library line to fill");
  text.replace(at, key.size(), cat("\nnvml_library = \"", nvml_library, "\"\n"));
  return text;
}

bool put_runtime_config(Run& r, const InstallPlan& plan, const InstallState& journal) {
  if (!plan.create_runtime_config) {
    bool ours = journal.runtime_config_written &&
                read_host(r.env.host, r.opt.runtime_config).value_or(std::nullopt) ==
                    journal.runtime_config_written;
    r.step("runtime config", Outcome::unchanged,
           cat(r.opt.runtime_config, ours ? " (written by an earlier install)" : " (kept as is)"));
    if (!r.opt.gpu_cdi_kinds.empty())
      r.report.notes.push_back(cat(r.opt.runtime_config, " exists and is kept: the GPU CDI kinds ",
                                   join(r.opt.gpu_cdi_kinds, ", "),
                                   " are not written; list them in its [cdi] gpu_kinds"));
    return true;
  }
  auto text =
      runtime_config_text(r.opt.nvml_library, r.opt.node_agent_namespace, r.opt.gpu_cdi_kinds);
  if (!text) return r.failed("runtime config", text.error().message);
  if (auto st = write_host(r.env.host, r.opt.runtime_config, *text); !st)
    return r.failed("runtime config", st.error().message);
  r.step("runtime config", Outcome::changed,
         cat(r.opt.runtime_config, " (defaults",
             r.opt.nvml_library.empty() ? "" : cat("; nvml_library ", r.opt.nvml_library), ")"));
  return true;
}

// The plugin_path links and where they lead, for the report.
std::string nri_plugin_text(const Run& r, const InstallPlan& plan) {
  return cat(plan.nri_plugin_link,
             plan.nri_fence_link.empty() ? std::string() : cat(", ", plan.nri_fence_link), " -> ",
             r.opt.nri_binary.link, " -> ", plan.nri_target);
}

// Step: gpufence-nri beside the shim (the same atomic link swap), started once on the host, then
// linked into containerd's plugin_path (the decider, and on containerd >= 2.2 the fence), from
// where containerd launches it at its next start.
bool put_nri_plugin(Run& r, const InstallPlan& plan) {
  if (!plan.nri) return true;
  auto done = install_binary(r.env.host, r.opt.nri_binary);
  if (!done) return r.failed("nri plugin", done.error().message);
  for (const auto& p : done->pruned) r.report.notes.push_back("removed old version " + p);
  std::string path = r.opt.host_exec == HostExec::nsenter
                         ? r.opt.nri_binary.link
                         : r.env.host.resolve(done->target).string();
  auto argv = host_command(r.opt.host_exec, {path, "--help"}, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return r.failed("nri plugin", res.error().message);
  if (res->exit_code != 0)
    return r.failed("nri plugin", cat(r.opt.nri_binary.link, " does not run on this host (`",
                                      shell_words(argv), "` exited ", res->exit_code, ": ",
                                      trim(res->out), "); containerd's config is left as it was"));
  bool changed = done->changed == Changed::yes;
  for (const auto& [link, before] : {std::pair{plan.nri_plugin_link, plan.nri_plugin_before},
                                     std::pair{plan.nri_fence_link, plan.nri_fence_before}}) {
    if (link.empty() || before == r.opt.nri_binary.link) continue;
    if (auto st = point_binary_link(r.env.host, link, r.opt.nri_binary.link); !st)
      return r.failed("nri plugin", st.error().message);
    changed = true;
  }
  r.step("nri plugin", changed ? Outcome::changed : Outcome::unchanged, nri_plugin_text(r, plan));
  return true;
}

bool put_cdi_spec(Run& r, const InstallPlan& plan) {
  if (r.opt.cdi == CdiMode::skip || !r.env.cdi_spec) {
    r.step("CDI spec", Outcome::skipped, "--cdi skip");
    return true;
  }
  if (!plan.cdi_text) {
    r.step("CDI spec", Outcome::unchanged, r.opt.cdi_output);
    return true;
  }
  if (!plan.cdi_backup.empty()) {
    auto b = write_backup_exclusive(
        r.env.host.resolve(r.opt.cdi_output), *plan.cdi_old,
        plan.cdi_backup.substr(r.opt.cdi_output.size() + std::string_view(".bak-").size()));
    if (!b) return r.failed("CDI spec", b.error().message);
  }
  if (auto st = write_host(r.env.host, r.opt.cdi_output, *plan.cdi_text); !st)
    return r.failed("CDI spec", st.error().message);
  r.step("CDI spec", Outcome::changed,
         plan.cdi_backup.empty() ? r.opt.cdi_output
                                 : cat(r.opt.cdi_output, " (backup ", plan.cdi_backup, ")"));
  return true;
}

// What the config already has, in the words of the chosen mode.
std::string already_configured(const Run& r) {
  std::string what;
  if (uses_handler(r.choice.mode)) what = "runtime " + r.opt.runtime_name;
  if (uses_nri(r.choice.mode))
    what += cat(what.empty() ? "" : " and ", "NRI on",
                r.choice.required_plugins
                    ? cat(", requiring ", r.opt.nri_plugin_name, " and ", r.opt.nri_fence_name)
                    : "");
  return cat(r.layout.config_path, " already has ", what);
}

bool edit_containerd_config(Run& r, const InstallPlan& plan) {
  if (plan.config.changes.empty()) {
    r.step("containerd config", Outcome::unchanged, already_configured(r));
    return true;
  }
  if (auto st = apply_setup_plan_with(plan.config, r.env.host, plan.backups); !st)
    return r.failed("containerd config",
                    cat(st.error().message, "; the previous config is left in place"));
  for (size_t i = 0; i < plan.config.changes.size(); ++i) {
    const auto& c = plan.config.changes[i];
    r.step("containerd config", Outcome::changed,
           cat(c.path, !c.existed                ? std::string(" (created)")
                       : plan.backups[i].empty() ? std::string(" (updated)")
                                                 : cat(" (backup ", plan.backups[i], ")")));
  }
  return true;
}

Result<std::vector<LoadedRuntime>> probe_once(const Run& r, milliseconds timeout) {
  return r.env.probe.loaded_runtimes(r.env.host.resolve(r.layout.socket).string(), timeout);
}

// Polls the CRI socket until containerd answers or the ready timeout passes.
Result<std::vector<LoadedRuntime>> wait_ready(const Run& r) {
  auto deadline = r.env.now() + r.opt.ready_timeout;
  Error last{Errc::rpc, "no answer"};
  while (true) {
    auto got = probe_once(r, milliseconds(2000));
    if (got) return got;
    last = got.error();
    if (r.env.now() >= deadline) break;
    r.env.sleep(milliseconds(250));
  }
  return fail(last.code, "containerd did not answer on ", r.layout.socket, " within ",
              r.opt.ready_timeout.count() / 1000.0, "s: ", last.message);
}

bool has_handler(const std::vector<LoadedRuntime>& loaded, const std::string& name,
                 const std::string& binary) {
  return std::any_of(loaded.begin(), loaded.end(), [&](const LoadedRuntime& l) {
    return l.name == name && l.binary_name == binary;
  });
}

// What, in the handler the running containerd loaded, would make gpufence-runtime not run or
// trust what a pod wrote (the doctor's containerd.handler-bypasses-binary and
// containerd.pod-annotations-cdi), judged on CRI status: containerd merges every file it imports
// into one table, so another drop-in's keys land in gpufence's handler even when install's own
// file is right. nullopt when there is none.
std::optional<std::string> handler_weakness(const std::vector<LoadedRuntime>& loaded,
                                            const std::string& name) {
  for (const auto& l : loaded) {
    if (l.name != name) continue;
    if (!is_runc_shim_type(l.runtime_type))
      return cat("its runtime_type is \"", escape_text(l.runtime_type),
                 "\", so BinaryName is never run");
    if (!l.runtime_path.empty())
      return cat(
          "its runtime_path \"", escape_text(l.runtime_path),
          "\" makes containerd start that shim instead of runc's, so BinaryName is never run");
    for (const auto& pattern : l.pod_annotations)
      if (pod_annotation_pattern_admits_cdi(pattern))
        return cat("its pod_annotations pattern \"", escape_text(pattern),
                   "\" copies a pod's cdi.k8s.io/ annotations into its containers' specs: any pod "
                   "could name devices the kubelet never allocated");
  }
  return std::nullopt;
}

// The verify failure for such a handler: where its keys come from is another file.
std::string weakness_text(const Run& r, const std::string& why) {
  return cat("containerd at ", r.layout.socket, " loaded runtime ", r.opt.runtime_name, ", but ",
             why, ". The key comes from a file containerd merges into ", r.layout.config_path,
             " (an import or drop-in): remove it there (`gpufence setup check-containerd` names "
             "it), or choose another --runtime-name");
}

bool nri_listening(const Run& r) {
  // Through the host's own links (/var/run -> /run): under --host-root /host the plain join
  // /host/var/run/... would follow /var/run's absolute link into this container's /run.
  auto sock = r.env.host.socket_path(r.opt.nri_socket);
  return sock && r.env.probe.nri_listening(sock->path);
}

// The running containerd enforces what the chosen mode needs: the handler, NRI's socket.
bool enforced(const Run& r, const std::vector<LoadedRuntime>& loaded) {
  if (uses_handler(r.choice.mode) && !has_handler(loaded, r.opt.runtime_name, r.opt.binary.link))
    return false;
  return !uses_nri(r.choice.mode) || nri_listening(r);
}

std::string enforced_text(const Run& r) {
  std::string out;
  if (uses_handler(r.choice.mode))
    out = cat("containerd runs handler ", r.opt.runtime_name, " -> ", r.opt.binary.link);
  if (uses_nri(r.choice.mode))
    out += cat(out.empty() ? "containerd" : ";", " listens on NRI socket ", r.opt.nri_socket);
  return out;
}

Status restart_containerd(Run& r) {
  r.restart_attempted = true;
  auto argv = host_command(r.opt.host_exec, r.layout.restart, r.opt.host_pid);
  auto res = r.env.runner.run(argv);
  if (!res) return std::unexpected(res.error());
  if (res->exit_code != 0)
    return fail(Errc::io, "`", shell_words(argv), "` exited ", res->exit_code, ": ",
                trim(res->out));
  r.report.restarted = true;
  return {};
}

}  // namespace gpufence::install_flow
