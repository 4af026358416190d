#include "containerd/setup.hpp"

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

namespace gpufence {
namespace {

constexpr std::string_view kK3sBegin =
    "# --- gpufence: begin (managed by gpufence setup containerd) ---";
constexpr std::string_view kK3sEnd = "# --- gpufence: end ---";
constexpr std::string_view kAddedComment =
    "# Added by gpufence setup containerd: GPU pods with this RuntimeClass handler run "
    "gpufence-runtime.";
// Device plugin annotations reach the OCI spec only through this allow-list (containerd
// pkg/cri/config, container_annotations); gpufence-runtime reads the plugin's CDI annotation
// from there. See docs/containerd-setup.md.
constexpr std::string_view kCdiAnnotations = "cdi.k8s.io/*";

std::string serialize(const toml::table& doc) {
  std::ostringstream out;
  out << toml::toml_formatter{doc};
  std::string text = out.str();
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text;
}

toml::table& ensure_table(toml::table& parent, std::string_view key) {
  if (!parent.get_as<toml::table>(key)) parent.insert_or_assign(key, toml::table{});
  return *parent.get_as<toml::table>(key);
}

toml::table& cri_containerd(toml::table& doc, int version) {
  return ensure_table(ensure_table(ensure_table(doc, "plugins"), cri_plugin_name(version)),
                      "containerd");
}

std::vector<std::string> containerd_key(int version) {
  return {"plugins", cri_plugin_name(version), "containerd"};
}

std::vector<std::string> runtime_key(int version, const std::string& name) {
  auto k = containerd_key(version);
  k.push_back("runtimes");
  k.push_back(name);
  return k;
}

// The handler's table, inheriting from `base` (the default runtime) what keeps pods behaving as
// they do under it — the cgroup driver above all, as nvidia-ctk runtime configure does — and
// nothing that would make containerd run something other than BinaryName through the runc v2
// shim: runtime_type is always io.containerd.runc.v2; runtime_engine, runtime_root, runtime_path
// and options other than runc's own (options.Runtime of a v1 linux runc) are dropped. Pod
// annotation patterns that would admit cdi.k8s.io/ are dropped too (see check-containerd).
toml::table handler_table(const toml::table* base, const std::string& base_name,
                          const std::string& binary, std::vector<std::string>& notes) {
  toml::table rt;
  toml::array annotations;
  toml::table options;
  std::vector<std::string> dropped;
  if (base) {
    for (const auto& [k, v] : *base) {
      std::string key(k.str());
      if (key == "runtime_type") continue;
      if (key == "runtime_engine" || key == "runtime_root" || key == "runtime_path") {
        if (!v.value_or(std::string()).empty()) dropped.push_back(key);
        continue;
      }
      if (key == "container_annotations" && v.is_array()) {
        annotations = *v.as_array();
        continue;
      }
      if (key == "pod_annotations" && v.is_array()) {
        toml::array kept;
        for (const auto& p : *v.as_array()) {
          auto pattern = p.value<std::string>();
          if (pattern && pod_annotation_pattern_admits_cdi(*pattern))
            dropped.push_back(cat("pod_annotations \"", *pattern, "\""));
          else
            kept.push_back(p);
        }
        rt.insert_or_assign("pod_annotations", std::move(kept));
        continue;
      }
      if (key == "options" && v.is_table()) {
        for (const auto& [ok, ov] : *v.as_table()) {
          if (ok.str() == "BinaryName") continue;
          if (is_runc_option_key(ok.str()))
            options.insert_or_assign(ok.str(), ov);
          else
            dropped.push_back(cat("options.", ok.str()));
        }
        continue;
      }
      rt.insert_or_assign(key, v);
    }
  }
  rt.insert_or_assign("runtime_type", "io.containerd.runc.v2");
  bool listed = false;
  for (const auto& a : annotations) listed |= a.value<std::string>() == kCdiAnnotations;
  if (!listed) annotations.push_back(std::string(kCdiAnnotations));
  rt.insert_or_assign("container_annotations", std::move(annotations));
  options.insert_or_assign("BinaryName", binary);
  rt.insert_or_assign("options", std::move(options));
  if (base) {
    std::string systemd = "unset";
    if (auto* o = rt.get_as<toml::table>("options"))
      if (auto v = (*o)["SystemdCgroup"].value<bool>()) systemd = *v ? "true" : "false";
    notes.push_back(cat("the handler inherits the settings of runtime '", base_name,
                        "' (the default runtime pods use now; SystemdCgroup ", systemd, ")"));
  } else {
    notes.push_back(
        "no runc-type default runtime to inherit from: the handler has containerd's defaults "
        "(cgroupfs); set options.SystemdCgroup = true if the kubelet uses the systemd driver");
  }
  if (!dropped.empty()) {
    notes.push_back(
        cat("not copied into the handler, since each would bypass or undermine "
            "gpufence-runtime: ",
            join(dropped, ", ")));
  }
  return rt;
}

// Our handler as TOML text to append to an existing file. nullopt when the table holds nested
// tables besides options (then the document is re-serialised instead).
std::optional<std::string> appendable_handler(int version, const std::string& name,
                                              const toml::table& handler) {
  toml::table flat = handler, options;
  if (auto* o = handler.get_as<toml::table>("options")) options = *o;
  flat.erase("options");
  for (const auto& [k, v] : flat) {
    if (v.is_table() || v.is_array_of_tables()) return std::nullopt;
  }
  for (const auto& [k, v] : options) {
    if (v.is_table() || v.is_array_of_tables()) return std::nullopt;
  }
  std::string header = runtime_table_name(version, name);
  auto indent = [](const std::string& body) {
    std::string out;
    for (std::string_view line : split(body, '\n')) {
      if (!line.empty()) out += cat("  ", line, "\n");
    }
    return out;
  };
  return cat("\n[", header, "]\n  ", kAddedComment, "\n", indent(serialize(flat)), "\n[", header,
             ".options]\n", indent(serialize(options)));
}

// What our change must guarantee, checked on the re-parsed result.
enum class DefaultRuntimeCheck { yes, no };  // no for a drop-in, whose runc lives elsewhere

Status verify(const std::string& text, const std::string& origin, int version_hint,
              const SetupOptions& opt, const std::string& handler, bool handler_expected_here,
              DefaultRuntimeCheck check_default = DefaultRuntimeCheck::yes) {
  auto cfg = parse_containerd_config(text, origin);
  if (!cfg) return std::unexpected(cfg.error().wrap("result does not parse"));
  if (cfg->version != version_hint) {
    return fail(Errc::internal, origin, ": result has version ", cfg->version, ", expected ",
                version_hint);
  }
  if (!handler_expected_here) return {};
  auto runtimes = cri_runtimes(*cfg);
  auto it = std::find_if(runtimes.begin(), runtimes.end(),
                         [&](const RuntimeHandler& h) { return h.name == handler; });
  if (it == runtimes.end() || it->binary_name != opt.binary ||
      it->runtime_type != "io.containerd.runc.v2" ||
      std::find(it->container_annotations.begin(), it->container_annotations.end(),
                kCdiAnnotations) == it->container_annotations.end()) {
    return fail(Errc::internal, origin, ": result lacks runtime ", handler,
                " (runc v2, BinaryName ", opt.binary, ", container_annotations ", kCdiAnnotations,
                ")");
  }
  for (const auto& f : check_containerd_config(*cfg, {{handler}, nullptr, false})) {
    bool default_check =
        f.id == "containerd.default-runtime-undefined" && check_default == DefaultRuntimeCheck::yes;
    if (default_check || f.id == "containerd.handler-missing" ||
        f.id == "containerd.handler-plain-runc" || f.id == "containerd.handler-bypasses-binary" ||
        f.id == "containerd.pod-annotations-cdi") {
      return fail(Errc::internal, origin, ": result fails its check: ", f.summary);
    }
  }
  return {};
}

// The text `edit` produced when it parses to exactly `expected`; nullopt otherwise.
std::optional<std::string> if_equivalent(const std::optional<std::string>& edit,
                                         const toml::table& expected, const std::string& origin) {
  if (!edit) return std::nullopt;
  auto parsed = parse_containerd_config(*edit, origin);
  if (!parsed || parsed->doc != expected) return std::nullopt;
  return edit;
}

std::string with_newline(std::string text) {
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text;
}

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

// ---- NRI (install --enforcement nri|both) ----

std::vector<std::string> nri_key() {
  return {"plugins", std::string(kNriPlugin)};
}
std::vector<std::string> validator_key() {
  return {"plugins", std::string(kNriPlugin), "default_validator"};
}
// The file's own default_validator table, when it has one.
const toml::table* validator_table(const ContainerdConfig& cfg) {
  const toml::table* t = &cfg.doc;
  for (const auto& k : validator_key())
    if (!(t = t->get_as<toml::table>(k))) return nullptr;
  return t;
}

// The required plugins `base` already lists with ours added (a drop-in's array replaces the
// root file's, so the user's entries are carried into it).
toml::array required_plugins_with(const ContainerdConfig& base,
                                  const std::vector<std::string>& ours) {
  toml::array out;
  auto settings = nri_settings(base);
  for (const auto& p : settings.required_plugins) out.push_back(p);
  for (const auto& p : ours)
    if (std::find(settings.required_plugins.begin(), settings.required_plugins.end(), p) ==
        settings.required_plugins.end())
      out.push_back(p);
  return out;
}

constexpr std::string_view kTolerateKey = "tolerate_missing_plugins_annotation";

// Whether the earlier install's waiver key is to be taken out of `validator`.
bool drops_earlier_waiver(const toml::table* validator, const NriEdit& nri) {
  if (!validator || nri.earlier_tolerate_annotation.empty() ||
      nri.tolerate_annotation == nri.earlier_tolerate_annotation)
    return false;
  return validator->get_as<std::string>(kTolerateKey) &&
         validator->get_as<std::string>(kTolerateKey)->get() == nri.earlier_tolerate_annotation;
}

// Sets NRI's keys in `doc` (the whole file, or a drop-in).
void apply_nri(toml::table& doc, const ContainerdConfig& base, const NriEdit& nri) {
  toml::table& plugin = ensure_table(ensure_table(doc, "plugins"), kNriPlugin);
  plugin.insert_or_assign("disable", false);
  if (nri.required_plugins.empty()) return;
  toml::table& v = ensure_table(plugin, "default_validator");
  v.insert_or_assign("enable", true);
  v.insert_or_assign("required_plugins", required_plugins_with(base, nri.required_plugins));
  if (!nri.tolerate_annotation.empty())
    v.insert_or_assign(kTolerateKey, nri.tolerate_annotation);
  else if (drops_earlier_waiver(&v, nri))
    v.erase(kTolerateKey);
}

// The text with the one-line assignment of `key` directly in table `table` replaced by
// `key = value_toml` (its indent kept), or taken out when `value_toml` is nullopt; nullopt when
// there is no such line (a dotted key, an inline table). For what set_toml_key leaves alone (an
// array's value); the caller re-parses the result (if_equivalent) and re-serialises when a value
// ran over several lines.
std::optional<std::string> edit_toml_key_line(std::string_view text,
                                              const std::vector<std::string>& table,
                                              std::string_view key,
                                              std::optional<std::string_view> value_toml) {
  for (const auto& sec : toml_sections(text)) {
    if (sec.array_of_tables || sec.key != table) continue;
    size_t at = sec.body;
    while (at < sec.end) {
      size_t eol = text.find('\n', at);
      size_t next = eol == std::string_view::npos || eol + 1 > sec.end ? sec.end : eol + 1;
      std::string_view raw = text.substr(at, next - at);
      std::string_view line = trim(raw);
      if (line.starts_with(key) && trim(line.substr(key.size())).starts_with("=")) {
        if (!value_toml) return cat(text.substr(0, at), text.substr(next));
        std::string_view indent = raw.substr(0, raw.find_first_not_of(" \t"));
        return cat(text.substr(0, at), indent, key, " = ", *value_toml, "\n", text.substr(next));
      }
      at = next;
    }
  }
  return std::nullopt;
}

// The same as line edits of the user's text (nullopt where a line edit is not possible).
std::optional<std::string> apply_nri_text(std::optional<std::string> text,
                                          const ContainerdConfig& base, const NriEdit& nri) {
  if (!text) return text;
  text = set_toml_key(*text, nri_key(), "disable", "false");
  if (!text || nri.required_plugins.empty()) return text;
  std::string list;
  for (const auto& p : required_plugins_with(base, nri.required_plugins))
    list += (list.empty() ? "" : ", ") + toml_quote(*p.value<std::string>());
  text = set_toml_key(*text, validator_key(), "enable", "true");
  if (text) {
    // An array already there (an earlier install's): set_toml_key leaves arrays alone.
    const std::string value = "[" + list + "]";
    auto set = set_toml_key(*text, validator_key(), "required_plugins", value);
    text = set ? set : edit_toml_key_line(*text, validator_key(), "required_plugins", value);
  }
  if (text && !nri.tolerate_annotation.empty())
    text = set_toml_key(*text, validator_key(), kTolerateKey, toml_quote(nri.tolerate_annotation));
  else if (text && drops_earlier_waiver(validator_table(base), nri))
    text = edit_toml_key_line(*text, validator_key(), kTolerateKey, std::nullopt);
  return text;
}

// What the NRI edit must guarantee, checked on the re-parsed result: NRI stated on, our plugins
// required through an enabled validator, and an earlier install's waiver gone.
Status verify_nri(const std::string& text, const std::string& origin, const NriEdit& nri) {
  if (!nri.enable) return {};
  auto cfg = parse_containerd_config(text, origin);
  if (!cfg) return std::unexpected(cfg.error().wrap("result does not parse"));
  auto s = nri_settings(*cfg);
  if (!s.enabled || !s.explicitly_set)
    return fail(Errc::internal, origin, ": result does not set [plugins.\"", kNriPlugin,
                "\"] disable = false");
  for (const auto& p : nri.required_plugins)
    if (!s.validator_enabled || std::find(s.required_plugins.begin(), s.required_plugins.end(),
                                          p) == s.required_plugins.end())
      return fail(Errc::internal, origin, ": result lacks \"", p,
                  "\" in default_validator.required_plugins");
  if (!nri.earlier_tolerate_annotation.empty() &&
      nri.tolerate_annotation != nri.earlier_tolerate_annotation &&
      s.tolerate_annotation == nri.earlier_tolerate_annotation)
    return fail(Errc::internal, origin, ": result keeps tolerate_missing_plugins_annotation = \"",
                nri.earlier_tolerate_annotation, "\"");
  return {};
}

// ---- versions 1 and 2: in place ----

Status plan_in_place(const SetupOptions& opt, const std::string& path, const ContainerdConfig& cfg,
                     const std::string& old_text, bool existed, SetupPlan& plan) {
  const std::string& name = opt.runtime_name;
  auto runtimes_before = cri_runtimes(cfg);
  auto before = std::find_if(runtimes_before.begin(), runtimes_before.end(),
                             [&](const RuntimeHandler& h) { return h.name == name; });
  bool had_handler = before != runtimes_before.end();
  bool has_runc = std::any_of(runtimes_before.begin(), runtimes_before.end(),
                              [](const RuntimeHandler& h) { return h.name == "runc"; });
  const bool write_handler = opt.handler == HandlerEdit::write;
  std::string base_name;
  const toml::table* base = inherit_base_runtime(cfg, name, &base_name);
  toml::table handler = handler_table(base, base_name, opt.binary, plan.notes);

  toml::table edited = cfg.doc;
  // Defining runtimes without runc while default_runtime_name is runc stops the CRI plugin.
  bool add_runc = write_handler && !has_runc && default_runtime_name(cfg) == "runc";
  if (write_handler) {
    toml::table& containerd = cri_containerd(edited, cfg.version);
    toml::table& runtimes = ensure_table(containerd, "runtimes");
    toml::table plain;
    plain.insert_or_assign("runtime_type", "io.containerd.runc.v2");
    if (add_runc) runtimes.insert_or_assign("runc", plain);
    runtimes.insert_or_assign(name, handler);
    if (opt.set_as_default) containerd.insert_or_assign("default_runtime_name", name);
  }
  if (opt.nri.enable) apply_nri(edited, cfg, opt.nri);
  if (edited == cfg.doc) return {};  // already configured
  if (write_handler && had_handler && before->binary_name != opt.binary) {
    plan.notes.push_back(cat("replaced runtime '", name, "' (BinaryName ",
                             before->binary_name.value_or("unset"),
                             ") with gpufence's; the backup keeps the old one"));
  }

  std::string text;
  if (!old_text.empty()) {
    // Edit the text: cut our old tables, append the new ones, set default_runtime_name in its
    // line. Used only when it parses to exactly the document we want.
    std::optional<std::string> t = with_newline(
        write_handler && had_handler ? remove_toml_tables(old_text, runtime_key(cfg.version, name))
                                     : old_text);
    if (add_runc) {
      *t += cat("\n[", runtime_table_name(cfg.version, "runc"),
                "]\n  runtime_type = ", "\"io.containerd.runc.v2\"\n");
    }
    if (write_handler) {
      auto block = appendable_handler(cfg.version, name, handler);
      t = block ? std::optional<std::string>(*t + *block) : std::nullopt;
    }
    if (t && write_handler && opt.set_as_default)
      t = set_toml_key(*t, containerd_key(cfg.version), "default_runtime_name", toml_quote(name));
    if (opt.nri.enable) t = apply_nri_text(t, cfg, opt.nri);
    if (auto kept = if_equivalent(t, edited, path)) {
      text = *kept;
    } else {
      plan.notes.push_back(cat(path,
                               " could not be edited line by line, so it was re-serialised: its "
                               "comments are gone (the backup keeps them)"));
    }
  }
  if (text.empty()) text = serialize(edited);
  if (auto st = verify(text, path, cfg.version, opt, name, write_handler); !st) return st;
  if (auto st = verify_nri(text, path, opt.nri); !st) return st;
  if (text != old_text) plan.changes.push_back({path, existed, old_text, text});
  return {};
}

// ---- version 3: a drop-in ----

// Adds gpufence's handler to a drop-in of `version`, inheriting the options of the runtime
// `base` (the config the drop-in joins) would otherwise run, and makes it the default when asked.
void add_handler(toml::table& drop, int version, const ContainerdConfig& base,
                 const SetupOptions& opt, std::vector<std::string>& notes) {
  const std::string& name = opt.runtime_name;
  std::string base_name;
  const toml::table* inherit = inherit_base_runtime(base, name, &base_name);
  ensure_table(cri_containerd(drop, version), "runtimes")
      .insert_or_assign(name, handler_table(inherit, base_name, opt.binary, notes));
  if (opt.set_as_default)
    cri_containerd(drop, version).insert_or_assign("default_runtime_name", name);
}

// Whether one of `cfg`'s imports names `path`, itself or by a glob (containerd's resolveImports:
// filepath.Glob, relative entries against the root file's directory).
bool imports_path(const ContainerdConfig& cfg, const std::string& path) {
  const toml::array* imports = cfg.doc.get_as<toml::array>("imports");
  if (!imports) return false;
  const std::filesystem::path dir = std::filesystem::path(cfg.path).parent_path();
  for (const auto& i : *imports) {
    auto entry = i.value<std::string>();
    if (!entry) continue;
    std::string full =
        std::filesystem::path(*entry).is_absolute() ? *entry : (dir / *entry).string();
    auto match = go_path_match(full, path);
    if (*entry == path || (match && *match)) return true;
  }
  return false;
}

Status plan_drop_in(const SetupOptions& opt, const std::string& path, const ContainerdConfig& cfg,
                    const std::string& old_text, bool existed, const ReadFile& read,
                    SetupPlan& plan) {
  const std::string& name = opt.runtime_name;
  std::string drop_in =
      opt.drop_in_path.empty()
          ? (std::filesystem::path(path).parent_path() / "conf.d" / "99-gpufence.toml").string()
          : opt.drop_in_path;
  auto old_drop = read(drop_in);
  if (!old_drop) return std::unexpected(old_drop.error());
  // The root file's version: containerd refuses a drop-in of a higher one (LoadConfigWithPlugins,
  // "drop-in config version %d higher than root config version %d").
  const int version = cfg.version;
  toml::table drop;
  drop.insert_or_assign("version", version);
  const bool write_handler = opt.handler == HandlerEdit::write;
  if (write_handler) add_handler(drop, version, cfg, opt, plan.notes);
  if (opt.nri.enable) apply_nri(drop, cfg, opt.nri);
  std::string drop_text = cat("# Written by gpufence setup containerd (listed in ", path,
                              "'s imports).\n", serialize(drop));
  if (auto st =
          verify(drop_text, drop_in, version, opt, name, write_handler, DefaultRuntimeCheck::no);
      !st)
    return st;
  if (auto st = verify_nri(drop_text, drop_in, opt.nri); !st) return st;
  if (drop_text != old_drop->value_or(""))
    plan.changes.push_back({drop_in, old_drop->has_value(), old_drop->value_or(""), drop_text});

  // Already imported: the path itself, or a glob of the user's that matches it (containerd 2.3's
  // default `imports = ['/etc/containerd/conf.d/*.toml']`; resolveImports expands globs with
  // filepath.Glob, relative entries against the root file's directory). Then the root file is
  // not touched at all.
  if (imports_path(cfg, drop_in)) return {};
  toml::table expected = cfg.doc;
  if (!expected.get_as<toml::array>("imports")) expected.insert_or_assign("imports", toml::array{});
  expected.get_as<toml::array>("imports")->push_back(drop_in);
  std::string text;
  if (old_text.empty()) {
    text = serialize(expected);
  } else if (auto kept = if_equivalent(add_toml_import(old_text, drop_in), expected, path)) {
    text = *kept;  // one line changed or added; the rest byte for byte
  } else {
    text = serialize(expected);
    plan.notes.push_back(cat(path,
                             ": imports could not be edited line by line, so the file was "
                             "re-serialised: its comments are gone (the backup keeps them)"));
  }
  if (auto st = verify(text, path, version, opt, name, false); !st) return st;
  plan.changes.push_back({path, existed, old_text, text});
  return {};
}

// ---- k0s: one drop-in of gpufence's own in /etc/k0s/containerd.d ----

// k0s regenerates containerd.toml, and so applies containerd.d, only while its first line is this
// (isK0sManagedConfig, k0s pkg/component/worker/containerd/component.go; k0s before 1.30 wrote a
// blank line first, which it skips).
constexpr std::string_view kK0sManaged = "# k0s_managed=true";

bool k0s_managed(std::string_view text) {
  for (std::string_view line : split(text, '\n')) {
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.empty()) continue;
    return line == kK0sManaged;
  }
  return false;
}

// The runtimes the handler inherits from: containerd.toml with the imports it names by path
// (k0s with containerd 1.x: /run/k0s/containerd-cri.toml, the CRI config k0s generated, runc
// included). Globs are not expanded (containerd.d itself, gpufence's earlier drop-in among
// them); an import that cannot be read leaves the root file alone.
ContainerdConfig k0s_base_config(const ContainerdConfig& root, const ReadFile& read) {
  auto merged = merge_imports(
      root,
      [&](const std::string& p) -> Result<std::string> {
        auto text = read(p);
        if (!text) return std::unexpected(text.error());
        if (!text->has_value()) return fail(Errc::not_found, p, " does not exist");
        return **text;
      },
      [](const std::string& pattern) {
        if (pattern.find_first_of("*?[\\") != std::string::npos) return std::vector<std::string>{};
        return std::vector<std::string>{pattern};
      });
  return merged ? *merged : root;
}

// k0s's containerd reads the handler from a drop-in in containerd.d that k0s loads beside the
// containerd.toml it writes itself: that file is read (its version and whether k0s manages it)
// and never written. The drop-in takes containerd.toml's version: 2 on k0s with containerd 1.x
// (a drop-in holding plugins."io.containerd.grpc.v1.cri" is merged into k0s's CRI config,
// configurer.go handleImports), 3 on k0s 1.36+ (containerd 2.2 imports containerd.d/*.toml and
// merges it; k0s refuses a drop-in of another version, k0sproject/k0s#7689). docs/install.md,
// "Distributions".
Result<SetupPlan> plan_k0s(const SetupOptions& opt, const ReadFile& read) {
  const DistributionRow& row = distribution_row(Distribution::k0s);
  if (opt.nri.enable || opt.handler == HandlerEdit::skip)
    return fail(Errc::unsupported,
                "NRI enforcement is not configured on k0s by gpufence (k0s generates its "
                "containerd config itself): use --enforcement runtime there");
  const std::string root_path(row.config_read);
  const std::filesystem::path default_drop_in(row.config_input);
  const std::string dir = default_drop_in.parent_path().string();
  const std::string drop_in = !opt.drop_in_path.empty()  ? opt.drop_in_path
                              : !opt.config_path.empty() ? opt.config_path
                                                         : default_drop_in.string();
  // k0s loads <dir>/*.toml and nothing else: a drop-in elsewhere would never be read.
  const std::filesystem::path p(drop_in);
  if (p.parent_path() != dir || p.extension() != ".toml" || p.stem().empty())
    return fail(Errc::invalid_argument, drop_in, ": k0s loads only ", dir,
                "/*.toml, so gpufence's drop-in must be one of them (default ",
                default_drop_in.string(), ")");

  auto root = read(root_path);
  if (!root) return std::unexpected(root.error());
  int version = 0;
  std::string version_why;
  ContainerdConfig base;
  if (!root->has_value()) {
    // k0s writes it when its worker starts (setupConfig); until then what it will write is
    // known only from the containerd it runs, or from the user.
    if (opt.version) {
      version = *opt.version;
      version_why = "--config-version";
    } else if (opt.node_version) {
      version = *opt.node_version >= 3 ? 3 : 2;
      version_why = cat("the running containerd writes version ", *opt.node_version);
    } else {
      return fail(Errc::not_found, root_path,
                  " does not exist: k0s writes it when its worker starts, and the drop-in must "
                  "have its version. Start k0s first, or pass --config-version (2 for k0s with "
                  "containerd 1.x, before 1.36; 3 from 1.36)");
    }
    if (version != 2 && version != 3)
      return fail(Errc::invalid_argument, "--config-version ", version,
                  ": k0s writes version 2 (containerd 1.x) or 3 (containerd 2.x)");
    base.path = root_path;
    base.version = version;
  } else {
    auto cfg = parse_containerd_config(**root, root_path);
    if (!cfg) return std::unexpected(cfg.error());
    version = cfg->version;
    version_why = cat(root_path, "'s version");
    if (k0s_managed(**root)) {
      if (version != 2 && version != 3)
        return fail(Errc::invalid_argument, root_path, " is version ", version,
                    ": k0s writes version 2 (containerd 1.x) or 3 (containerd 2.x), so what it "
                    "does with a drop-in here is unknown; nothing written");
    } else if (version < 3 || !imports_path(*cfg, drop_in)) {
      // Not k0s's any more: k0s leaves containerd.d alone (docs/runtime.md), and only
      // containerd's own import of the drop-in (versions 3-4 merge it) would still apply it.
      return fail(Errc::unsupported, root_path, " is not managed by k0s (its first line is not \"",
                  kK0sManaged, "\"), so k0s does not apply ", dir, "/*.toml",
                  version < 3
                      ? " (and containerd 1.x replaces whole plugin sections from an import)"
                      : ", and the file does not import " + drop_in,
                  ": nothing written. Add the handler to that file itself (gpufence setup "
                  "containerd --config ",
                  root_path, "), or give it back to k0s (remove it and restart k0s)");
    }
    if (opt.version && *opt.version != version)
      return fail(Errc::invalid_argument, "--config-version ", *opt.version, ": ", root_path,
                  " is version ", version, ", and the drop-in must be the same version");
    // k0s rewrites containerd.toml at its start: a file of the other containerd line is stale
    // (k0s upgraded or downgraded since), and a drop-in in its version would be refused.
    if (opt.node_version && (*opt.node_version >= 3) != (version >= 3))
      return fail(Errc::conflict, root_path, " is version ", version,
                  " but the running containerd writes version ", *opt.node_version,
                  ": k0s rewrites the file when it restarts; restart k0s, then run again");
    base = k0s_base_config(*cfg, read);
  }

  SetupPlan plan;
  plan.config_path = drop_in;
  plan.handler_name = opt.runtime_name;
  auto old_drop = read(drop_in);
  if (!old_drop) return std::unexpected(old_drop.error());
  const std::string& name = opt.runtime_name;
  toml::table drop;
  drop.insert_or_assign("version", version);
  add_handler(drop, version, base, opt, plan.notes);
  std::string text =
      cat("# gpufence's runtime handler for k0s (gpufence install, or setup containerd --flavor "
          "k0s).\n# ",
          version == 2 ? "k0s merges this file into /run/k0s/containerd-cri.toml"
                       : "containerd imports this file (k0s's containerd.toml lists containerd.d)",
          "; ", root_path, " is k0s's own.\n", serialize(drop));
  if (auto st = verify(text, drop_in, version, opt, name, true, DefaultRuntimeCheck::no); !st)
    return std::unexpected(st.error());
  if (text != old_drop->value_or(""))
    plan.changes.push_back(
        {drop_in, old_drop->has_value(), old_drop->value_or(""), text, LinkPolicy::refuse});
  plan.notes.push_back(cat("config version ", version, " (", version_why, "); k0s watches ", dir,
                           " and signals its containerd when it changes, which is not relied on"));
  plan.notes.push_back(
      cat("restart k0s to apply it now: systemctl restart k0sworker (k0scontroller "
          "on a controller with --enable-worker)"));
  return plan;
}

}  // namespace

Result<SetupPlan> plan_containerd_setup(const SetupOptions& opt, const ReadFile& read,
                                        const IsExecutable& executable) {
  if (opt.set_as_default && opt.node_agents != DefaultForNodeAgents::accept) {
    return fail(Errc::invalid_argument,
                "--set-as-default would make gpufence-runtime the runtime of every pod without a "
                "runtimeClassName, the node agents' own among them: gpufence-device-plugin is "
                "privileged and requests no GPU, so under privileged = \"isolate\" it loses every "
                "GPU and the node's GPU capacity drops to 0. Give GPU pods runtimeClassName: ",
                opt.runtime_name,
                " instead; or, if the device plugin and other node agents run with a RuntimeClass "
                "whose handler is plain runc, add --include-node-agents");
  }
  const DistributionRow& row = distribution_row(opt.distribution);
  if (row.config_source == ConfigSource::drop_in_dir) return plan_k0s(opt, read);
  if (row.config_source == ConfigSource::go_template) {
    if (opt.nri.enable || opt.handler == HandlerEdit::skip)
      return fail(Errc::unsupported,
                  "NRI enforcement is not configured on k3s/rke2 by gpufence (their containerd "
                  "config is rendered from a template): use --enforcement runtime there");
    return plan_k3s(opt, read, executable);
  }

  SetupPlan plan;
  plan.handler_name = opt.runtime_name;
  const std::string path =
      opt.config_path.empty() ? std::string(row.config_input) : opt.config_path;
  plan.config_path = path;
  auto existing = read(path);
  if (!existing) return std::unexpected(existing.error());
  const std::string old_text = existing->value_or("");
  const bool rendered_template = row.config_source == ConfigSource::template_file;
  if (rendered_template && !existing->has_value()) {
    return fail(Errc::not_found, path, " does not exist: is ", row.name,
                " installed? (--config to point elsewhere)");
  }
  ContainerdConfig cfg;
  if (old_text.empty()) {
    cfg.path = path;
    cfg.version = opt.version.value_or(opt.node_version.value_or(2));
    cfg.doc.insert_or_assign("version", cfg.version);
  } else {
    auto parsed = parse_containerd_config(old_text, path);
    if (!parsed) return std::unexpected(parsed.error());
    cfg = std::move(*parsed);
  }
  if (opt.nri.enable && cfg.version < 2)
    return fail(Errc::unsupported, path, ": config version ", cfg.version,
                " has no NRI plugin table gpufence edits; migrate it to version 2 "
                "(containerd config migrate) first");
  for (const auto& f : check_containerd_config(cfg, {{}, nullptr, false})) {
    plan.notes.push_back(cat("already in ", path, " (left alone): ", f.summary, "; fix: ", f.fix));
  }
  // In place or a drop-in, as the version's row says (containerd/versions.hpp); microk8s's
  // template always in place.
  Status st =
      config_version_row(cfg.version).placement == HandlerPlacement::in_place || rendered_template
          ? plan_in_place(opt, path, cfg, old_text, existing->has_value(), plan)
          : plan_drop_in(opt, path, cfg, old_text, existing->has_value(), read, plan);
  if (!st) return std::unexpected(st.error());
  if (rendered_template)
    plan.notes.push_back("restart microk8s to apply: microk8s stop && microk8s start");
  else
    plan.notes.push_back("restart containerd to apply: systemctl restart containerd");
  return plan;
}

std::optional<int> config_version_of_release(std::string_view release) {
  release = trim(release);
  if (release.starts_with("v")) release.remove_prefix(1);
  auto dot = release.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto major = parse_number<int>(release.substr(0, dot));
  std::string_view rest = release.substr(dot + 1);
  size_t end = 0;
  while (end < rest.size() && rest[end] >= '0' && rest[end] <= '9') ++end;
  auto minor = parse_number<int>(rest.substr(0, end));
  if (!major || !minor) return std::nullopt;
  // The newest version a line at or before this release writes; an older release, the oldest.
  std::optional<int> out;
  for (const auto& row : config_version_table()) {
    if (!row.written_from) continue;
    if (!out || *row.written_from <= std::pair{*major, *minor}) out = row.version;
    if (*row.written_from > std::pair{*major, *minor}) break;
  }
  return out;
}

std::vector<std::string> choose_backup_paths(const SetupPlan& plan, const HostFs& host) {
  const std::string stamp = utc_compact_stamp(std::chrono::system_clock::now());
  std::vector<std::string> out;
  for (const auto& change : plan.changes) {
    if (!change.existed) {
      out.emplace_back();
      continue;
    }
    std::string base = cat(change.path, ".bak-", stamp);
    for (int n = 0;; ++n) {
      std::string name = n == 0 ? base : cat(base, ".", n);
      bool taken = host.exists(name) || std::find(out.begin(), out.end(), name) != out.end();
      if (!taken) {
        out.push_back(name);
        break;
      }
    }
  }
  return out;
}

Status apply_setup_plan_with(const SetupPlan& plan, const HostFs& host,
                             const std::vector<std::string>& backups) {
  if (backups.size() != plan.changes.size())
    return fail(Errc::internal, "apply_setup_plan: one backup path per change");
  // Every file is checked before the first is written (a version 3 plan writes two): a conflict
  // found half-way would leave a drop-in without its import, or the reverse.
  std::vector<std::filesystem::path> targets;
  for (const auto& change : plan.changes) {
    Result<std::filesystem::path> target = host.resolve(change.path);
    if (change.links == LinkPolicy::refuse) {
      if (auto st = check_own_file_path(host, change.path); !st) return std::unexpected(st.error());
    } else {
      target = write_target_through_links(host.resolve(change.path), host.root());
    }
    if (!target) return std::unexpected(target.error());
    auto current = read_file(*target);
    if (current ? (!change.existed || *current != change.old_text)
                : (change.existed || current.error().code != Errc::not_found)) {
      return fail(Errc::conflict, change.path,
                  " changed since it was read (or could not be read again): nothing written; run "
                  "gpufence setup containerd again");
    }
    targets.push_back(*target);
  }
  for (size_t i = 0; i < plan.changes.size(); ++i) {
    const auto& change = plan.changes[i];
    const std::filesystem::path local = host.resolve(change.path);
    const auto* target = &targets[i];
    std::error_code ec;
    if (change.links == LinkPolicy::follow)
      std::filesystem::create_directories(target->parent_path(), ec);
    if (!backups[i].empty()) {
      // write_backup_exclusive names the file "<file>.bak-<stamp>[.N]": the stamp is the chosen
      // name's suffix, and a different name back means the chosen one was taken meanwhile.
      const std::string prefix = change.path + ".bak-";
      if (!backups[i].starts_with(prefix))
        return fail(Errc::internal, backups[i], ": not a backup name of ", change.path);
      std::string stamp = backups[i].substr(prefix.size());
      auto backup = write_backup_exclusive(local, change.old_text, stamp);
      if (!backup) return std::unexpected(backup.error().wrap("backup"));
      if (*backup != host.resolve(backups[i])) {
        ::unlink(backup->c_str());
        return fail(Errc::conflict, "backup ", backups[i],
                    " was taken after it was chosen: nothing more written");
      }
    }
    Status written = change.links == LinkPolicy::refuse
                         ? write_own_file(host, change.path, change.new_text)
                         : write_file_atomic(*target, change.new_text);
    if (!written) return std::unexpected(written.error());
  }
  return {};
}

Status check_own_file_path(const HostFs& host, const std::string& path) {
  std::filesystem::path prefix = "/";
  const std::filesystem::path full(path);
  for (auto it = full.begin(); it != full.end(); ++it) {
    if (*it == "/" || it->empty()) continue;
    prefix /= *it;
    auto info = host.stat(prefix.string());
    if (!info) {
      if (info.error().code == Errc::not_found) return {};  // made by the write, as a directory
      return std::unexpected(info.error());
    }
    const bool last = std::next(it) == full.end();
    if (info->type == FileType::symlink)
      return fail(Errc::denied, path, ": ", prefix.string(),
                  " is a symbolic link, and gpufence writes its own file only where no link "
                  "decides where the bytes land: nothing written (remove the link)");
    if (last && info->type != FileType::regular)
      return fail(Errc::denied, path, " is not a regular file: nothing written");
    if (!last && info->type != FileType::directory)
      return fail(Errc::denied, path, ": ", prefix.string(), " is not a directory");
  }
  return {};
}

Status write_own_file(const HostFs& host, const std::string& path, std::string_view text) {
  if (auto st = check_own_file_path(host, path); !st) return st;
  // Symlinks::none: openat2 RESOLVE_NO_SYMLINKS on the whole path, so a link planted at a
  // directory since the check fails the write; one at the name is replaced by the rename.
  return write_file_atomic(host.resolve(path), text, Durability::fsync, Symlinks::none,
                           MakeDir::yes);
}

Result<std::vector<std::string>> apply_setup_plan(const SetupPlan& plan, const HostFs& host) {
  auto backups = choose_backup_paths(plan, host);
  if (auto st = apply_setup_plan_with(plan, host, backups); !st) return std::unexpected(st.error());
  std::vector<std::string> out;
  for (const auto& b : backups)
    if (!b.empty()) out.push_back(b);
  return out;
}

Status check_k0s_runtime_name(const HostFs& host, const std::string& drop_in,
                              const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(drop_in).parent_path();
  if (auto names = host.list(dir.string()); !names && names.error().code != Errc::not_found)
    return std::unexpected(names.error());  // unreadable: what k0s loads is unknown
  // The files k0s loads: filepath.Glob("<dir>/*.toml"), dot-files such as ".toml" included.
  for (const auto& p : go_glob(host, (dir / "*.toml").string())) {
    if (p == drop_in) continue;
    auto text = host.read(p);
    if (!text) return std::unexpected(text.error().wrap("k0s drop-in"));
    auto cfg = parse_containerd_config(*text, p);
    if (!cfg) return std::unexpected(cfg.error());
    // Under any version's CRI table: containerd 2.x migrates a file of another version (or of
    // none) before it merges it, and k0s merges what it finds.
    if (defines_runtime_in_any_version(*cfg, name)) {
      return fail(Errc::conflict, p, " defines runtime '", name,
                  "' too: k0s and containerd merge the drop-ins in ", dir.string(),
                  " into one table, so the handler would not be gpufence's alone (its BinaryName, "
                  "runtime_path or annotations could win): nothing written. Choose another "
                  "--runtime-name (and the RuntimeClass's handler to match), or remove that file");
    }
  }
  return {};
}

std::string runtime_class_manifest(const std::string& handler) {
  return cat("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: ", handler,
             "\nhandler: ", handler, "\n");
}

}  // namespace gpufence
