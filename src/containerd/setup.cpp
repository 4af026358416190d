#include "containerd/setup.hpp"

#include <ctime>
#include <filesystem>
#include <sstream>

#include "common/file.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

constexpr std::string_view kK3sBegin =
    "# --- gpufence: begin (managed by gpufence setup containerd) ---";
constexpr std::string_view kK3sEnd = "# --- gpufence: end ---";

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

// The handler's table: a copy of the runc runtime (so cgroup driver and other options match),
// runtime_type runc v2, BinaryName the shim.
toml::table handler_table(const toml::table* runc, const std::string& binary) {
  toml::table rt = runc ? *runc : toml::table{};
  if (!rt.get("runtime_type") || rt["runtime_type"].value_or(std::string()).empty()) {
    rt.insert_or_assign("runtime_type", "io.containerd.runc.v2");
  }
  rt.erase("runtime_engine");  // deprecated, ignored by runc.v2
  // Device plugin annotations reach the OCI spec only through this allow-list (containerd
  // pkg/cri/config); gpufence-runtime reads the plugin's CDI annotation from there.
  toml::array annotations;
  if (auto* existing = rt.get_as<toml::array>("container_annotations")) annotations = *existing;
  bool listed = false;
  for (const auto& a : annotations) listed |= a.value<std::string>() == "cdi.k8s.io/*";
  if (!listed) annotations.push_back("cdi.k8s.io/*");
  rt.insert_or_assign("container_annotations", std::move(annotations));
  ensure_table(rt, "options").insert_or_assign("BinaryName", binary);
  return rt;
}

// Adds the handler (and runc, if the file defines runtimes without it) to a config's CRI table.
void add_handler(toml::table& doc, int version, const SetupOptions& opt) {
  toml::table& containerd = cri_containerd(doc, version);
  toml::table& runtimes = ensure_table(containerd, "runtimes");
  const toml::table* runc = runtimes.get_as<toml::table>("runc");
  toml::table handler = handler_table(runc, opt.binary);
  if (!runc) {
    // Defining runtimes without runc while default_runtime_name is runc stops the CRI plugin.
    toml::table plain;
    plain.insert_or_assign("runtime_type", "io.containerd.runc.v2");
    runtimes.insert_or_assign("runc", std::move(plain));
  }
  runtimes.insert_or_assign(opt.runtime_name, std::move(handler));
  if (opt.set_as_default) containerd.insert_or_assign("default_runtime_name", opt.runtime_name);
}

// What our change must guarantee, checked on the re-parsed result.
enum class DefaultRuntimeCheck { yes, no };  // no for a drop-in, whose runc lives elsewhere

Status verify(const std::string& text, const std::string& origin, int version_hint,
              const SetupOptions& opt, bool handler_expected_here,
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
                         [&](const RuntimeHandler& h) { return h.name == opt.runtime_name; });
  if (it == runtimes.end() || it->binary_name != opt.binary) {
    return fail(Errc::internal, origin, ": result lacks runtime ", opt.runtime_name,
                " with BinaryName ", opt.binary);
  }
  for (const auto& f : check_containerd_config(*cfg, {{opt.runtime_name}, nullptr, false})) {
    bool default_check =
        f.id == "containerd.default-runtime-undefined" && check_default == DefaultRuntimeCheck::yes;
    if (default_check || f.id == "containerd.handler-missing" ||
        f.id == "containerd.handler-plain-runc") {
      return fail(Errc::internal, origin, ": result fails its check: ", f.summary);
    }
  }
  return {};
}

std::string k3s_block(int version, const SetupOptions& opt) {
  std::string table = runtime_table_name(version, opt.runtime_name);
  return cat(kK3sBegin, "\n[", table, "]\n  runtime_type = \"io.containerd.runc.v2\"\n[", table,
             ".options]\n  BinaryName = \"", opt.binary, "\"\n", kK3sEnd, "\n");
}

// Our handler as TOML text to append to an existing file, so a first-time setup changes only
// the lines it adds. nullopt when the table has nested tables besides options (then the whole
// document is re-serialised instead).
std::optional<std::string> appendable_handler(int version, const std::string& name,
                                              const toml::table& handler,
                                              const std::optional<std::string>& default_runtime) {
  if (default_runtime) return std::nullopt;  // default_runtime_name sits in an existing table
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
  return cat(
      "\n# Added by gpufence setup containerd: GPU pods with this RuntimeClass handler run "
      "gpufence-runtime.\n[",
      header, "]\n", indent(serialize(flat)), "\n[", header, ".options]\n",
      indent(serialize(options)));
}

}  // namespace

Result<Flavor> parse_flavor(std::string_view name) {
  if (name == "containerd") return Flavor::containerd;
  if (name == "microk8s") return Flavor::microk8s;
  if (name == "k3s") return Flavor::k3s;
  return fail(Errc::invalid_argument, "unknown flavor '", name, "' (containerd, microk8s, k3s)");
}

std::string default_config_path(Flavor flavor) {
  switch (flavor) {
    case Flavor::containerd:
      return "/etc/containerd/config.toml";
    case Flavor::microk8s:
      return "/var/snap/microk8s/current/args/containerd-template.toml";
    case Flavor::k3s:
      return "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl";
  }
  return "/etc/containerd/config.toml";
}

Result<SetupPlan> plan_containerd_setup(const SetupOptions& opt, const ReadFile& read) {
  SetupPlan plan;
  const std::string path =
      opt.config_path.empty() ? default_config_path(opt.flavor) : opt.config_path;
  auto existing = read(path);
  if (!existing) return std::unexpected(existing.error());
  const std::string old_text = existing->value_or("");

  if (opt.flavor == Flavor::k3s) {
    // k3s renders config.toml from this Go template; "base" is its own generated config, and
    // TOML appended after it adds our handler. Our block is kept between markers.
    int version = opt.version.value_or(2);
    std::string text = old_text.empty() ? "{{ template \"base\" . }}\n\n" : old_text;
    auto begin = text.find(kK3sBegin);
    if (begin != std::string::npos) {
      auto end = text.find(kK3sEnd, begin);
      if (end == std::string::npos)
        return fail(Errc::parse, path, ": gpufence begin marker without end marker");
      auto stop = text.find('\n', end);
      text.erase(begin, (stop == std::string::npos ? text.size() : stop + 1) - begin);
    }
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += k3s_block(version, opt);
    // The block alone must be valid TOML with the handler in it.
    if (auto st = verify(cat("version = ", version, "\n", k3s_block(version, opt)), path, version,
                         opt, true, DefaultRuntimeCheck::no);
        !st) {
      return std::unexpected(st.error());
    }
    if (opt.set_as_default) {
      plan.notes.push_back("k3s: set the default runtime with k3s's own flag, --default-runtime " +
                           opt.runtime_name + " (default_runtime_name lives in the base template)");
    }
    plan.notes.push_back("restart k3s to render the new containerd config");
    if (text != old_text) plan.changes.push_back({path, existing->has_value(), old_text, text});
    return plan;
  }

  if (opt.flavor == Flavor::microk8s && !existing->has_value()) {
    return fail(Errc::not_found, path,
                " does not exist: is microk8s installed? (--config to point elsewhere)");
  }
  ContainerdConfig cfg;
  if (old_text.empty()) {
    cfg.path = path;
    cfg.version = opt.version.value_or(2);
    cfg.doc.insert_or_assign("version", cfg.version);
  } else {
    auto parsed = parse_containerd_config(old_text, path);
    if (!parsed) return std::unexpected(parsed.error());
    cfg = std::move(*parsed);
  }
  for (const auto& f : check_containerd_config(cfg, {{}, nullptr, false})) {
    plan.notes.push_back(cat("already in ", path, " (left alone): ", f.summary, "; fix: ", f.fix));
  }

  if (cfg.version <= 2 || opt.flavor == Flavor::microk8s) {
    // containerd 1.x replaces whole plugin sections from imports, so edit in place. Prefer
    // appending our table (the rest of the file, comments included, stays as it was); fall back
    // to re-serialising the document when that is not valid TOML or not enough.
    auto runtimes_before = cri_runtimes(cfg);
    bool had_handler =
        std::any_of(runtimes_before.begin(), runtimes_before.end(),
                    [&](const RuntimeHandler& h) { return h.name == opt.runtime_name; });
    bool has_runc = std::any_of(runtimes_before.begin(), runtimes_before.end(),
                                [](const RuntimeHandler& h) { return h.name == "runc"; });
    toml::table edited = cfg.doc;
    add_handler(edited, cfg.version, opt);
    std::string text;
    if (!had_handler && has_runc && !old_text.empty()) {
      const toml::table* runtimes =
          cri_containerd(edited, cfg.version).get_as<toml::table>("runtimes");
      auto block = appendable_handler(
          cfg.version, opt.runtime_name, *runtimes->get_as<toml::table>(opt.runtime_name),
          opt.set_as_default ? std::optional<std::string>(opt.runtime_name) : std::nullopt);
      if (block) {
        std::string appended = old_text + (old_text.back() == '\n' ? "" : "\n") + *block;
        if (verify(appended, path, cfg.version, opt, true)) text = appended;
      }
    }
    bool unchanged = had_handler && serialize(edited) == serialize(cfg.doc);
    if (text.empty() && !unchanged) text = serialize(edited);
    if (!text.empty()) {
      if (auto st = verify(text, path, cfg.version, opt, true); !st)
        return std::unexpected(st.error());
      if (text != old_text) plan.changes.push_back({path, existing->has_value(), old_text, text});
    }
  } else {
    // Version 3 (containerd 2.x): a drop-in with only our handler, listed in imports.
    std::string drop_in =
        opt.drop_in_path.empty()
            ? (std::filesystem::path(path).parent_path() / "conf.d" / "99-gpufence.toml").string()
            : opt.drop_in_path;
    auto old_drop = read(drop_in);
    if (!old_drop) return std::unexpected(old_drop.error());
    toml::table drop;
    drop.insert_or_assign("version", 3);
    // Copy runc's settings from the main file so the handler behaves like it.
    const toml::table* main_runtimes = nullptr;
    if (auto* p = cfg.doc.get_as<toml::table>("plugins")) {
      if (auto* c = p->get_as<toml::table>(cri_plugin_name(3))) {
        if (auto* cd = c->get_as<toml::table>("containerd"))
          main_runtimes = cd->get_as<toml::table>("runtimes");
      }
    }
    toml::table& runtimes = ensure_table(cri_containerd(drop, 3), "runtimes");
    runtimes.insert_or_assign(
        opt.runtime_name,
        handler_table(main_runtimes ? main_runtimes->get_as<toml::table>("runc") : nullptr,
                      opt.binary));
    if (opt.set_as_default)
      cri_containerd(drop, 3).insert_or_assign("default_runtime_name", opt.runtime_name);
    std::string drop_text = serialize(drop);
    if (auto st = verify(drop_text, drop_in, 3, opt, true, DefaultRuntimeCheck::no); !st)
      return std::unexpected(st.error());
    if (drop_text != old_drop->value_or(""))
      plan.changes.push_back({drop_in, old_drop->has_value(), old_drop->value_or(""), drop_text});

    toml::array* imports = cfg.doc.get_as<toml::array>("imports");
    bool listed = false;
    if (imports) {
      for (const auto& i : *imports) listed |= i.value<std::string>() == drop_in;
    }
    if (!listed) {
      if (!imports) {
        cfg.doc.insert_or_assign("imports", toml::array{});
        imports = cfg.doc.get_as<toml::array>("imports");
      }
      imports->push_back(drop_in);
      std::string text = serialize(cfg.doc);
      if (auto st = verify(text, path, 3, opt, false); !st) return std::unexpected(st.error());
      plan.changes.push_back({path, existing->has_value(), old_text, text});
    }
  }
  if (opt.flavor == Flavor::microk8s)
    plan.notes.push_back("restart microk8s to apply: microk8s stop && microk8s start");
  else
    plan.notes.push_back("restart containerd to apply: systemctl restart containerd");
  return plan;
}

Result<std::vector<std::string>> apply_setup_plan(const SetupPlan& plan) {
  std::vector<std::string> backups;
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  for (const auto& change : plan.changes) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(change.path).parent_path(), ec);
    if (change.existed) {
      std::string backup = change.path + ".bak-" + stamp;
      if (auto st = write_file_atomic(backup, change.old_text); !st)
        return std::unexpected(st.error().wrap("backup"));
      backups.push_back(backup);
    }
    if (auto st = write_file_atomic(change.path, change.new_text); !st)
      return std::unexpected(st.error());
  }
  return backups;
}

std::string runtime_class_manifest(const std::string& handler) {
  return cat("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: ", handler,
             "\nhandler: ", handler, "\n");
}

}  // namespace gpufence
