// k3s and rke2: gpufence's block in the config template they render (containerd/setup_parts.hpp).
#include "containerd/setup_parts.hpp"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include "common/file.hpp"
#include "common/go_match.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "containerd/toml_text.hpp"
#include "containerd/versions.hpp"

namespace gpufence::setup_parts {

// ---- k3s / rke2 ----

// Runtimes k3s renders into its base template by itself when it finds their binary (k3s
// pkg/agent/containerd/runtimes.go: the PATH and the GPU Operator's toolkit directory).
struct K3sRuntime {
  std::string_view handler, binary;
};
constexpr K3sRuntime kK3sRuntimes[] = {
    {"nvidia", "nvidia-container-runtime"},
    {"nvidia-experimental", "nvidia-container-runtime-experimental"},
    {"nvidia-cdi", "nvidia-container-runtime.cdi"},
    {"crun", "crun"}};
constexpr std::string_view kK3sSearchDirs[] = {"/usr/local/nvidia/toolkit",
                                               "/usr/local/sbin",
                                               "/usr/local/bin",
                                               "/usr/sbin",
                                               "/usr/bin",
                                               "/sbin",
                                               "/bin"};

std::string without_gpufence_block(std::string text, const std::string& path, Status& st) {
  auto begin = text.find(kK3sBegin);
  if (begin == std::string::npos) return text;
  auto end = text.find(kK3sEnd, begin);
  if (end == std::string::npos) {
    st = fail(Errc::parse, path, ": gpufence begin marker without end marker");
    return text;
  }
  auto stop = text.find('\n', end);
  text.erase(begin, (stop == std::string::npos ? text.size() : stop + 1) - begin);
  return text;
}

// Handler names some table of `text` defines (any CRI plugin name).
std::set<std::string> runtime_tables(std::string_view text) {
  std::set<std::string> out;
  for (const auto& s : toml_sections(text)) {
    for (size_t i = 0; i + 1 < s.key.size(); ++i) {
      if (s.key[i] == "runtimes" && i >= 1 && s.key[i - 1] == "containerd") {
        out.insert(s.key[i + 1]);
        break;
      }
    }
  }
  return out;
}

std::optional<int> version_line(std::string_view text) {
  for (std::string_view line : split(text, '\n')) {
    std::string_view t = trim(line);
    if (!t.starts_with("version")) continue;
    t.remove_prefix(7);
    t = trim(t);
    if (!t.starts_with("=")) continue;
    t.remove_prefix(1);
    t = trim(t.substr(0, t.find('#')));
    if (auto v = parse_number<int>(trim(t))) return *v;
  }
  return std::nullopt;
}

std::string k3s_block(int version, const std::string& name, const std::string& binary) {
  std::string table = runtime_table_name(version, name);
  return cat(kK3sBegin, "\n[", table, "]\n  runtime_type = \"io.containerd.runc.v2\"\n",
             "  container_annotations = [\"", kCdiAnnotations, "\"]\n[", table,
             ".options]\n  BinaryName = ", toml_quote(binary),
             "\n  # k3s's own runc gets the same cgroup driver from this variable.\n",
             "  SystemdCgroup = {{ .SystemdCgroup }}\n", kK3sEnd, "\n");
}

Result<SetupPlan> plan_k3s(const SetupOptions& opt, const ReadFile& read,
                           const IsExecutable& executable) {
  SetupPlan plan;
  const DistributionRow& row = distribution_row(opt.distribution);
  const std::string dir(row.config_dir);
  const std::string rendered_path = dir + "/config.toml";
  auto rendered = read(rendered_path);
  if (!rendered) return std::unexpected(rendered.error());
  int rendered_version = 0;  // 0: none rendered yet, or no version line
  if (rendered->has_value()) rendered_version = version_line(**rendered).value_or(0);

  // What the node runs decides, when known: k3s on containerd 2.x renders its version 3 base
  // template and reads config-v3.toml.tmpl first, on 1.x config.toml.tmpl (k3s
  // pkg/agent/containerd/config_linux.go, setupContainerdConfig); else the config k3s rendered
  // last says which line it is.
  int node_line = opt.node_version ? (*opt.node_version >= 3 ? 3 : 2) : rendered_version;
  auto template_of = [&dir](int version) {
    return cat(dir, "/", config_version_row(version).k3s_template);
  };
  std::string path = opt.config_path;
  std::optional<std::string> existing;
  if (path.empty()) {
    std::vector<std::string> candidates = {template_of(3), template_of(2)};
    if (node_line == 2) std::swap(candidates[0], candidates[1]);  // 1.x never reads the v3 one
    for (const std::string& candidate : candidates) {
      auto r = read(candidate);
      if (!r) return std::unexpected(r.error());
      if (r->has_value()) {
        path = candidate;
        existing = **r;
        break;
      }
    }
    if (path.empty()) path = template_of(node_line == 3 ? 3 : 2);
  } else {
    auto r = read(path);
    if (!r) return std::unexpected(r.error());
    existing = *r;
  }
  const std::string old_text = existing.value_or("");
  Status st;
  std::string text = old_text.empty() ? "{{ template \"base\" . }}\n\n"
                                      : without_gpufence_block(old_text, path, st);
  if (!st) return std::unexpected(st.error());

  // The template's version: the flag; its own `version =` line; the CRI plugin it names; what
  // the node runs (a template that only calls `base` renders k3s's base template, version 3 on
  // containerd 2.x, 2 on 1.x); the version k3s rendered last time; its name.
  int version = 2;
  std::string version_why = "default";
  const bool calls_base = text.find("template \"base\"") != std::string::npos;
  if (opt.version) {
    version = *opt.version;
    version_why = "--config-version";
  } else if (auto v = version_line(text)) {
    version = *v;
    version_why = "the template's version line";
  } else if (!calls_base && !trim(text).empty()) {
    // The user's additions alone, without k3s's base template: the rendered file has no
    // version line. containerd 1.x and 2.3 read it as version 1 and find a handler under
    // plugins.cri (v1MigratePluginName); 2.0-2.2 ignore the runtimes of such a file (measured
    // with 2.1.9's `config dump`), so there the template needs a version line of its own.
    if (opt.node_version == 3)
      return fail(Errc::invalid_argument, path,
                  ": this template does not call k3s's base template and has no version line, so "
                  "the config k3s renders from it has none, and containerd 2.0-2.2 ignore the "
                  "runtimes of such a file: add `version = 3` as its first line, then run again");
    version = 1;
    version_why = "the template has no version line and does not call k3s's base template";
  } else if (text.find("io.containerd.cri.v1.") != std::string::npos) {
    // Version 3 splits CRI into io.containerd.cri.v1.images and .runtime: a template naming
    // either (k3s's own tests merge a template's [plugins."io.containerd.cri.v1.images"] into
    // the version 3 base) renders a version 3 file.
    version = 3;
    version_why = "the template names a version 3 CRI plugin (io.containerd.cri.v1.*)";
  } else if (text.find("io.containerd.grpc.v1.cri") != std::string::npos) {
    version = 2;
    version_why = "the template names io.containerd.grpc.v1.cri";
  } else if (opt.node_version) {
    version = node_line;
    version_why = cat("k3s's base template for the containerd the node runs (its config version ",
                      *opt.node_version, ")");
  } else if (rendered_version != 0) {
    version = rendered_version;
    version_why = "the config k3s rendered last (" + rendered_path + ")";
  } else if (std::filesystem::path(path).filename() == config_version_row(3).k3s_template) {
    version = 3;
    version_why = "the template's name";
  }
  if (version < 1 || version > kMaxConfigVersion)
    return fail(Errc::invalid_argument, path, ": k3s templates are version 1 to ",
                kMaxConfigVersion, ", not ", version);

  // Names already taken: tables in the template itself, tables in the rendered config outside
  // our block (k3s's own), and the runtimes k3s renders when it finds their binary. A second
  // table of one name makes containerd refuse the whole file.
  std::map<std::string, std::string> taken;  // name -> why
  for (const auto& n : runtime_tables(text)) taken[n] = "the template defines it";
  if (rendered->has_value()) {
    Status ignored;
    for (const auto& n : runtime_tables(without_gpufence_block(**rendered, rendered_path, ignored)))
      taken.emplace(n, "k3s rendered it into " + rendered_path);
  }
  if (executable) {
    for (const auto& rt : kK3sRuntimes) {
      for (auto d : kK3sSearchDirs) {
        std::string bin = cat(d, "/", rt.binary);
        if (!executable(bin)) continue;
        taken.emplace(std::string(rt.handler), cat("k3s renders it itself: it finds ", bin));
        break;
      }
    }
  }
  std::string name = opt.runtime_name;
  if (auto it = taken.find(name); it != taken.end()) {
    std::string why = it->second;
    for (std::string candidate : {std::string("gpufence"), std::string("gpufence-runtime")}) {
      if (!taken.contains(candidate)) {
        name = candidate;
        break;
      }
    }
    if (name == opt.runtime_name)
      return fail(Errc::conflict, path, ": runtime '", name, "' exists already (", why,
                  "); choose another with --runtime-name");
    plan.notes.push_back(cat("k3s already has a runtime '", opt.runtime_name, "' (", why,
                             "): a second table of that name stops containerd, so gpufence's "
                             "handler is named '",
                             name, "'; point the RuntimeClass at handler ", name));
  }
  plan.handler_name = name;
  plan.config_path = path;

  std::string block = k3s_block(version, name, opt.binary);
  text = with_newline(text) + block;
  // The block alone, with k3s's variable filled in, must be valid TOML with the handler in it.
  std::string probe = block;
  probe.replace(probe.find("{{ .SystemdCgroup }}"), 20, "false");
  if (auto v = verify(version == 1 ? probe : cat("version = ", version, "\n", probe), path, version,
                      opt, name, true, DefaultRuntimeCheck::no);
      !v) {
    return std::unexpected(v.error());
  }
  plan.notes.push_back(cat("config version ", version, " (", version_why,
                           "); the handler's SystemdCgroup follows k3s's own runc"));
  if (opt.set_as_default) {
    plan.notes.push_back(cat("k3s: set the default runtime with k3s's own flag, --default-runtime ",
                             name, " (default_runtime_name lives in the base template)"));
  }
  plan.notes.push_back(cat("restart ", row.name, " to render the new containerd config"));
  if (text != old_text) plan.changes.push_back({path, existing.has_value(), old_text, text});
  return plan;
}

}  // namespace gpufence::setup_parts
