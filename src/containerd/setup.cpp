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
#include "containerd/setup_parts.hpp"
#include "containerd/toml_text.hpp"
#include "containerd/versions.hpp"

namespace gpufence::setup_parts {

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

Status verify(const std::string& text, const std::string& origin, int version_hint,
              const SetupOptions& opt, const std::string& handler, bool handler_expected_here,
              DefaultRuntimeCheck check_default) {
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

}  // namespace gpufence::setup_parts

namespace gpufence {

using namespace setup_parts;

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

}  // namespace gpufence
