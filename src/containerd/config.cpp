#include "containerd/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "cdi/spec_dirs.hpp"
#include "common/go_match.hpp"
#include "common/strings.hpp"
#include "containerd/versions.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {
namespace {

// Fields of runc's Options proto (containerd runtime/v2/runc/options/oci.proto) as the TOML
// keys containerd decodes them from. Anything else in a runc runtime's options is dropped
// silently (containerd 1.6.20 kept `Env` in its raw map and never used it).
const std::set<std::string, std::less<>> kRuncOptionKeys = {
    "NoPivotRoot", "NoNewKeyring", "ShimCgroup",    "IoUid",         "IoGid",       "BinaryName",
    "Root",        "CriuPath",     "SystemdCgroup", "CriuImagePath", "CriuWorkPath"};

const toml::table* table_at(const toml::table& root, std::initializer_list<std::string_view> path) {
  const toml::table* t = &root;
  for (auto key : path) {
    auto* next = t->get_as<toml::table>(key);
    if (!next) return nullptr;
    t = next;
  }
  return t;
}

const toml::table* cri_containerd_table(const ContainerdConfig& cfg) {
  return table_at(cfg.doc, {"plugins", cri_plugin_name(cfg.version), "containerd"});
}

void deep_merge(toml::table& to, const toml::table& from) {
  for (const auto& [key, node] : from) {
    auto* dst = to.get_as<toml::table>(key.str());
    if (dst && node.is_table())
      deep_merge(*dst, *node.as_table());
    else
      to.insert_or_assign(key.str(), node);
  }
}

}  // namespace

std::string cri_plugin_name(int version) {
  return std::string(config_version_row(version).cri_plugin);
}

std::string runtime_table_name(int version, std::string_view runtime) {
  std::string cri = cri_plugin_name(version);
  std::string quoted = cri.find('.') != std::string::npos ? "\"" + cri + "\"" : cri;
  return cat("plugins.", quoted, ".containerd.runtimes.", runtime);
}

Result<ContainerdConfig> parse_containerd_config(std::string_view text, std::string_view origin) {
  ContainerdConfig cfg;
  cfg.path = std::string(origin);
  try {
    cfg.doc = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return fail(Errc::parse, origin, ":", where.line, ":", where.column, ": ", e.description());
  }
  if (auto v = cfg.doc["version"].value<int64_t>()) {
    if (*v < 1 || *v > kMaxConfigVersion)
      return fail(Errc::parse, origin, ": unsupported config version ", *v, " (1 to ",
                  kMaxConfigVersion, ")");
    cfg.version = static_cast<int>(*v);
  } else if (cfg.doc.contains("version")) {
    return fail(Errc::parse, origin, ": version must be an integer");
  } else if (!table_at(cfg.doc, {"plugins", "cri"}) &&
             table_at(cfg.doc, {"plugins", "io.containerd.grpc.v1.cri"})) {
    // No version line, but the CRI plugin under its fully qualified name (NVIDIA's toolkit
    // writes such files): containerd's version-1 migration keeps a name that has a dot
    // (v1MigratePluginName, cmd/containerd/server/config/config.go), so its runtimes are the
    // version 2 tables, and the default runtime a handler must inherit from lives there.
    cfg.version = 2;
    cfg.implicit_version = true;
  }
  return cfg;
}

namespace {

std::vector<RuntimeHandler> runtimes_of(const toml::table* runtimes) {
  std::vector<RuntimeHandler> out;
  if (!runtimes) return out;
  for (const auto& [name, node] : *runtimes) {
    const toml::table* rt = node.as_table();
    if (!rt) continue;
    RuntimeHandler h;
    h.name = std::string(name.str());
    h.runtime_type =
        rt->get("runtime_type") ? rt->get("runtime_type")->value_or(std::string()) : "";
    h.runtime_engine = (*rt)["runtime_engine"].value_or(std::string());
    h.runtime_root = (*rt)["runtime_root"].value_or(std::string());
    h.runtime_path = (*rt)["runtime_path"].value_or(std::string());
    if (const auto* opts = rt->get_as<toml::table>("options")) {
      for (const auto& [k, v] : *opts) h.option_keys.emplace_back(k.str());
      if (auto bin = (*opts)["BinaryName"].value<std::string>(); bin && !bin->empty())
        h.binary_name = *bin;
      if (auto r = (*opts)["Runtime"].value<std::string>(); r && !r->empty())
        h.options_runtime = *r;
    }
    auto strings = [&](std::string_view key) {
      std::vector<std::string> v;
      if (const auto* arr = rt->get_as<toml::array>(key)) {
        for (const auto& e : *arr)
          if (auto str = e.value<std::string>()) v.push_back(*str);
      }
      return v;
    };
    h.pod_annotations = strings("pod_annotations");
    h.container_annotations = strings("container_annotations");
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace

bool is_runc_shim_type(std::string_view runtime_type) {
  return runtime_type == "io.containerd.runc.v2" || runtime_type == "io.containerd.runc.v1" ||
         runtime_type.empty();
}

bool is_runc_option_key(std::string_view key) {
  return kRuncOptionKeys.contains(key);
}

bool defines_runtime_in_any_version(const ContainerdConfig& cfg, std::string_view name) {
  for (const auto& row : config_version_table())
    if (table_at(cfg.doc, {"plugins", row.cri_plugin, "containerd", "runtimes", name})) return true;
  return false;
}

std::vector<RuntimeHandler> cri_runtimes(const ContainerdConfig& cfg) {
  const toml::table* containerd = cri_containerd_table(cfg);
  return runtimes_of(containerd ? containerd->get_as<toml::table>("runtimes") : nullptr);
}

std::string default_runtime_name(const ContainerdConfig& cfg) {
  const toml::table* containerd = cri_containerd_table(cfg);
  if (containerd) {
    if (auto name = (*containerd)["default_runtime_name"].value<std::string>();
        name && !name->empty())
      return *name;
  }
  return "runc";
}

static bool is_runc_family(std::string_view runtime_type) {
  return runtime_type.empty() || runtime_type == "io.containerd.runc.v2" ||
         runtime_type == "io.containerd.runc.v1" ||
         runtime_type == "io.containerd.runtime.v1.linux" ||
         runtime_type.find("${") != std::string_view::npos;  // microk8s fills in runc.v2
}

const toml::table* inherit_base_runtime(const ContainerdConfig& cfg, std::string_view skip,
                                        std::string* chosen) {
  const toml::table* containerd = cri_containerd_table(cfg);
  const toml::table* runtimes = containerd ? containerd->get_as<toml::table>("runtimes") : nullptr;
  if (!runtimes) return nullptr;
  for (const std::string& name : {default_runtime_name(cfg), std::string("runc")}) {
    if (name == skip) continue;
    const toml::table* rt = runtimes->get_as<toml::table>(name);
    if (!rt || !is_runc_family((*rt)["runtime_type"].value_or(std::string()))) continue;
    if (chosen) *chosen = name;
    return rt;
  }
  return nullptr;
}

std::optional<std::string> pod_annotation_cdi_witness(std::string_view pattern) {
  // The keys a pod can carry under the prefix: the API server admits only qualified names
  // (apimachinery ValidateAnnotations -> IsQualifiedName: a name of [-._a-zA-Z0-9], at least one
  // character), so the search runs over those characters (its witness is a key a pod can send).
  // Not searched: the alphanumeric first and last character and the 63-character limit (so it
  // can only over-report), and U+212A KELVIN SIGN, which ValidateAnnotations admits because it
  // lower-cases the key to 'k' first (docs/containerd-setup.md).
  static constexpr std::string_view kNameCharacters =
      "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-._";
  auto witness = go_path_match_with_prefix(pattern, kCdiAnnotationPrefix, {kNameCharacters, 1});
  if (witness) return *witness;
  // containerd ignores Match's error (`ok, _ := path.Match(pattern, key)`): a malformed pattern
  // passes no annotation at all.
  if (witness.error().code == Errc::parse) return std::nullopt;
  // Undecided (a pattern needing a huge search): fail closed, as if it let the prefix through.
  return cat(kCdiAnnotationPrefix, "<undecided: ", witness.error().message, ">");
}

bool pod_annotation_pattern_admits_cdi(std::string_view pattern) {
  return pod_annotation_cdi_witness(pattern).has_value();
}

CdiSettings cdi_settings(const ContainerdConfig& cfg) {
  CdiSettings out;
  out.enabled = config_version_row(cfg.version).cdi_by_default;
  const toml::table* cri = table_at(cfg.doc, {"plugins", cri_plugin_name(cfg.version)});
  if (!cri) return out;
  if (auto on = (*cri)["enable_cdi"].value<bool>()) {
    out.enabled = *on;
    out.explicitly_set = true;
  }
  if (const auto* dirs = cri->get_as<toml::array>("cdi_spec_dirs")) {
    out.spec_dirs.clear();
    for (const auto& d : *dirs)
      if (auto s = d.value<std::string>()) out.spec_dirs.push_back(*s);
  }
  return out;
}

NriSettings nri_settings(const ContainerdConfig& cfg, std::optional<int> containerd_major) {
  NriSettings out;
  out.enabled =
      containerd_major ? *containerd_major >= 2 : config_version_row(cfg.version).nri_by_default;
  const toml::table* nri = table_at(cfg.doc, {"plugins", kNriPlugin});
  if (!nri) return out;
  if (auto off = (*nri)["disable"].value<bool>()) {
    out.enabled = !*off;
    out.explicitly_set = true;
  }
  if (auto sock = (*nri)["socket_path"].value<std::string>(); sock && !sock->empty())
    out.socket_path = *sock;
  if (const auto* v = nri->get_as<toml::table>("default_validator")) {
    out.validator_enabled = (*v)["enable"].value_or(false);
    if (const auto* req = v->get_as<toml::array>("required_plugins"))
      for (const auto& r : *req)
        if (auto name = r.value<std::string>()) out.required_plugins.push_back(*name);
    out.tolerate_annotation = (*v)["tolerate_missing_plugins_annotation"].value_or(std::string());
  }
  return out;
}

Result<ContainerdConfig> merge_imports(
    const ContainerdConfig& main,
    const std::function<Result<std::string>(const std::string&)>& read,
    const std::function<std::vector<std::string>(const std::string&)>& glob) {
  ContainerdConfig merged = main;
  const toml::array* imports = main.doc.get_as<toml::array>("imports");
  if (!imports) return merged;
  std::filesystem::path base = std::filesystem::path(main.path).parent_path();
  for (const auto& item : *imports) {
    auto pattern = item.value<std::string>();
    if (!pattern) return fail(Errc::parse, main.path, ": imports must be strings");
    std::string full =
        std::filesystem::path(*pattern).is_absolute() ? *pattern : (base / *pattern).string();
    for (const auto& path : glob(full)) {
      auto text = read(path);
      if (!text) return std::unexpected(text.error().wrap("import of " + main.path));
      auto imported = parse_containerd_config(*text, path);
      if (!imported) return std::unexpected(imported.error());
      for (const auto& [key, node] : imported->doc) {
        if (key == "version" || key == "imports") continue;
        if (key == "plugins" && node.is_table() && main.version < 3) {
          // containerd 1.x: each plugin section of an import replaces the main file's.
          auto* plugins = merged.doc.get_as<toml::table>("plugins");
          if (!plugins) {
            merged.doc.insert_or_assign("plugins", toml::table{});
            plugins = merged.doc.get_as<toml::table>("plugins");
          }
          for (const auto& [pk, pv] : *node.as_table()) plugins->insert_or_assign(pk.str(), pv);
        } else if (auto* dst = merged.doc.get_as<toml::table>(key.str()); dst && node.is_table()) {
          deep_merge(*dst, *node.as_table());
        } else {
          merged.doc.insert_or_assign(key.str(), node);
        }
      }
    }
  }
  return merged;
}

Result<ContainerdConfig> merge_imports_from_host(const ContainerdConfig& main, const HostFs& host) {
  return merge_imports(
      main, [&](const std::string& p) { return host.read(p); },
      [&](const std::string& pattern) { return go_glob(host, pattern); });
}

namespace {

bool has_glob_meta(std::string_view s) {
  return s.find_first_of("*?[\\") != std::string_view::npos;  // filepath.hasMeta
}

// filepath.glob: the names of `dir` that match `file`, appended in sorted order.
void glob_dir(const HostFs& host, const std::string& dir, std::string_view file,
              std::vector<std::string>& out) {
  auto names = host.list(dir);  // sorted; fails unless dir is a directory (Go: Stat, IsDir)
  if (!names) return;
  for (const auto& n : *names) {
    auto match = go_path_match(file, n);
    if (match && *match) out.push_back(dir == "/" ? "/" + n : dir + "/" + n);
  }
}

// filepath.Glob on a pattern with a meta character.
void glob_pattern(const HostFs& host, const std::string& pattern, std::vector<std::string>& out) {
  const auto slash = pattern.rfind('/');
  std::string dir = slash == std::string::npos ? "" : pattern.substr(0, slash + 1);
  const std::string file = pattern.substr(slash == std::string::npos ? 0 : slash + 1);
  if (dir.empty())
    dir = ".";  // cleanGlobPath
  else if (dir != "/")
    dir.pop_back();
  if (!has_glob_meta(dir)) return glob_dir(host, dir, file, out);
  if (dir == pattern) return;  // ErrBadPattern
  std::vector<std::string> dirs;
  glob_pattern(host, dir, dirs);
  for (const auto& d : dirs) glob_dir(host, d, file, out);
}

}  // namespace

std::vector<std::string> go_glob(const HostFs& host, const std::string& pattern) {
  if (pattern.find('*') == std::string::npos) {
    if (host.exists(pattern)) return {pattern};
    return {};
  }
  if (!go_path_match(pattern, "")) return {};  // Glob checks the whole pattern first
  std::vector<std::string> out;
  glob_pattern(host, pattern, out);
  return out;
}

namespace {

// One runtime table as the checks see it: the handler and where it sits in the file.
struct RuntimeTable {
  RuntimeHandler handler;
  std::string where;  // "<file>: [<table>]", the evidence's start
};

// What every containerd check reads: the config, the options, and its runtime tables read once.
struct ConfigUnderCheck {
  const ContainerdConfig& cfg;
  const ContainerdCheckOptions& options;
  // Under plugins."io.containerd.runtime.v1.linux".runtimes: the CRI plugin never reads them.
  const toml::table* v1_linux_runtimes = nullptr;
  std::vector<RuntimeTable> v1_linux;
  std::vector<RuntimeTable> cri;  // the CRI plugin's runtimes, the handlers a RuntimeClass names

  bool is_gpu_handler(std::string_view name) const {
    return std::find(options.handlers.begin(), options.handlers.end(), name) !=
           options.handlers.end();
  }
  bool defines(std::string_view name) const {
    return std::any_of(cri.begin(), cri.end(),
                       [&](const RuntimeTable& t) { return t.handler.name == name; });
  }
  // The table a fix names: where the CRI plugin reads a runtime in this config's version.
  std::string table_of(std::string_view runtime) const {
    return runtime_table_name(cfg.version, runtime);
  }
};

ConfigUnderCheck read_config_under_check(const ContainerdConfig& cfg,
                                         const ContainerdCheckOptions& options) {
  ConfigUnderCheck in{cfg, options, nullptr, {}, {}};
  in.v1_linux_runtimes =
      table_at(cfg.doc, {"plugins", "io.containerd.runtime.v1.linux", "runtimes"});
  for (auto& h : runtimes_of(in.v1_linux_runtimes)) {
    std::string where =
        cat(cfg.path, ": [plugins.\"io.containerd.runtime.v1.linux\".runtimes.", h.name, "]");
    in.v1_linux.push_back({std::move(h), std::move(where)});
  }
  for (auto& h : cri_runtimes(cfg)) {
    std::string where = cat(cfg.path, ": [", runtime_table_name(cfg.version, h.name), "]");
    in.cri.push_back({std::move(h), std::move(where)});
  }
  return in;
}

// Every runtime table with settings of its own: the ignored v1 linux ones, then the CRI ones.
template <class F>
void for_each_runtime_table(const ConfigUnderCheck& in, F&& f) {
  for (const auto& t : in.v1_linux) f(t);
  for (const auto& t : in.cri) f(t);
}

// The runtimes whose path matters for GPU pods: a handler RuntimeClasses name, or one that runs
// gpufence-runtime.
template <class F>
void for_each_gpu_runtime(const ConfigUnderCheck& in, F&& f) {
  for (const auto& t : in.cri) {
    const RuntimeHandler& h = t.handler;
    bool runs_gpufence =
        h.binary_name && std::filesystem::path(*h.binary_name).filename() == "gpufence-runtime";
    if (in.is_gpu_handler(h.name) || runs_gpufence) f(t);
  }
}

bool runs_under_runc_shim(const RuntimeHandler& h) {
  return is_runc_shim_type(h.runtime_type);
}

// A runtimes table under the old linux runtime plugin: the CRI plugin never reads it.
void check_runtime_under_v1_linux(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  if (!in.v1_linux_runtimes) return;
  for (const auto& [name, node] : *in.v1_linux_runtimes) {
    out.push_back(
        {"containerd.runtime-under-v1-linux", Severity::error,
         cat("runtime '", name.str(),
             "' is defined under plugins.\"io.containerd.runtime.v1.linux\", which the CRI "
             "plugin does not read"),
         cat(in.cfg.path, ": [plugins.\"io.containerd.runtime.v1.linux\".runtimes.", name.str(),
             "] (that plugin only has shim, runtime, runtime_root, no_shim, shim_debug; "
             "containerd drops the table silently)"),
         cat("define it as [", in.table_of(name.str()),
             "] with runtime_type = \"io.containerd.runc.v2\" and options.BinaryName = the "
             "runtime's path, "
             "or run: gpufence setup containerd --runtime-name ",
             name.str())});
  }
}

// runtime_engine under the runc shim: only io.containerd.runtime.v1.linux ran it.
void check_runtime_engine_ignored(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  for_each_runtime_table(in, [&](const RuntimeTable& t) {
    const RuntimeHandler& h = t.handler;
    if (h.runtime_engine.empty() || !runs_under_runc_shim(h)) return;
    out.push_back({"containerd.runtime-engine-ignored", Severity::error,
                   cat("runtime '", h.name, "' sets runtime_engine, which ",
                       h.runtime_type.empty() ? "io.containerd.runc.v2" : h.runtime_type,
                       " ignores: ", h.runtime_engine, " never runs"),
                   cat(t.where, " runtime_engine = \"", h.runtime_engine,
                       "\" (deprecated; only io.containerd.runtime.v1.linux used it)"),
                   cat("remove runtime_engine and set [", in.table_of(h.name),
                       ".options] BinaryName = \"", h.runtime_engine, "\"")});
  });
}

// An option runc's Options do not have (the seed's `Env`): containerd drops it silently.
void check_unknown_runc_option(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  for_each_runtime_table(in, [&](const RuntimeTable& t) {
    const RuntimeHandler& h = t.handler;
    if (!runs_under_runc_shim(h)) return;
    for (const auto& key : h.option_keys) {
      if (kRuncOptionKeys.contains(key)) continue;
      out.push_back(
          {"containerd.unknown-runc-option", Severity::error,
           cat("runtime '", h.name, "' has option '", key,
               "', which runc's options do not have: containerd ignores it silently"),
           cat(t.where, ".options has ", key,
               " (runc options: BinaryName, SystemdCgroup, Root, NoPivotRoot, NoNewKeyring, "
               "ShimCgroup, IoUid, IoGid, CriuPath, CriuImagePath, CriuWorkPath)"),
           key == "Env"
               ? std::string("remove Env: containerd passes no environment to the runtime this "
                             "way; GPU selection comes from the device plugin's Allocate answer")
               : cat("remove ", key, " from the options table")});
    }
  });
}

// A GPU handler without BinaryName runs plain runc: nothing enforces the allocation.
void check_handler_plain_runc(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  for (const auto& [h, where] : in.cri) {
    if (!in.is_gpu_handler(h.name) || h.binary_name) continue;
    out.push_back(
        {"containerd.handler-plain-runc", Severity::error,
         cat("runtime '", h.name,
             "' has no options.BinaryName: it runs plain runc, so nothing enforces GPU "
             "allocation"),
         cat(where, " has no BinaryName"),
         cat("set [", in.table_of(h.name), ".options] BinaryName = \"", kRuntimeBinaryPath,
             "\", or run: gpufence setup containerd --runtime-name ", h.name)});
  }
}

// A BinaryName that is not an executable file on the host (checked only with a host to look at).
void check_binary_missing(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  const HostFs* host = in.options.host;
  if (!host) return;
  for (const auto& [h, where] : in.cri) {
    if (!h.binary_name) continue;
    // Judged inside the host's root (the doctor in a pod sees the host at /host): a regular
    // file with an execute bit, its links followed as the host follows them.
    auto info = host->stat_target(*h.binary_name);
    bool executable = info && info->type == FileType::regular && (info->mode & 0111) != 0;
    if (executable) continue;
    out.push_back({"containerd.binary-missing", Severity::error,
                   cat("runtime '", h.name, "' points at ", *h.binary_name, ", which is ",
                       info ? "not executable" : "missing"),
                   cat(where, ".options BinaryName = \"", *h.binary_name, "\""),
                   cat("install the runtime at ", *h.binary_name,
                       " (gpufence: copy build/bin/gpufence-runtime there) or fix BinaryName")});
  }
}

// A GPU handler wired to some other runtime, when gpufence is expected to enforce.
void check_handler_not_gpu_runtime(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  if (!in.options.expect_gpufence) return;
  for (const auto& [h, where] : in.cri) {
    if (!in.is_gpu_handler(h.name) || !h.binary_name) continue;
    std::string base = std::filesystem::path(*h.binary_name).filename();
    if (base == "gpufence-runtime" || base.starts_with("nvidia-container-runtime")) continue;
    out.push_back({"containerd.handler-not-gpu-runtime", Severity::warning,
                   cat("runtime '", h.name, "' runs ", *h.binary_name,
                       ", neither gpufence-runtime nor NVIDIA's runtime"),
                   cat(where, ".options BinaryName = \"", *h.binary_name, "\""),
                   "point BinaryName at gpufence-runtime so the allocation is enforced"});
  }
}

// A GPU handler must run its BinaryName through the runc v2 shim; anything else never runs
// gpufence-runtime, whatever BinaryName says.
void check_handler_bypasses_binary(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  for_each_gpu_runtime(in, [&](const RuntimeTable& t) {
    const RuntimeHandler& h = t.handler;
    auto bypass = [&](std::string evidence, std::string why) {
      out.push_back(
          {"containerd.handler-bypasses-binary", Severity::error,
           cat("runtime '", h.name, "' never runs its BinaryName: ", why), std::move(evidence),
           cat("set runtime_type = \"io.containerd.runc.v2\", remove runtime_engine, "
               "runtime_root, runtime_path and options.Runtime, keep options.BinaryName; or run: "
               "gpufence setup containerd --runtime-name ",
               h.name)});
    };
    const std::string& type = h.runtime_type;
    if (type.find("${") != std::string::npos) return;  // a template variable (microk8s)
    if (type == "io.containerd.runtime.v1.linux") {
      bypass(cat(t.where, " runtime_type = \"", type, "\""),
             cat("the v1 linux shim ignores options.BinaryName and runs ",
                 h.options_runtime
                     ? *h.options_runtime
                     : (h.runtime_engine.empty() ? std::string("runc") : h.runtime_engine)));
    } else if (type == "io.containerd.runc.v1") {
      bypass(cat(t.where, " runtime_type = \"", type, "\""),
             "io.containerd.runc.v1 is deprecated and gone in containerd 2.0, where the handler "
             "fails; io.containerd.runc.v2 is the shim gpufence-runtime is tested under");
    } else if (!type.empty() && type != "io.containerd.runc.v2") {
      bypass(
          cat(t.where, " runtime_type = \"", type, "\""),
          cat(type, " is not the runc shim, so BinaryName does not name the OCI runtime it runs"));
    }
    if (!h.runtime_path.empty()) {
      bypass(cat(t.where, " runtime_path = \"", h.runtime_path, "\""),
             cat("runtime_path makes containerd start ", h.runtime_path,
                 " as the shim instead of containerd-shim-runc-v2"));
    }
    // options.Runtime under the runc shim is dropped (containerd.unknown-runc-option says so).
  });
}

// pod_annotations that let a pod write a cdi.k8s.io/ annotation gpufence-runtime would trust.
void check_pod_annotations_cdi(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  for_each_gpu_runtime(in, [&](const RuntimeTable& t) {
    const RuntimeHandler& h = t.handler;
    for (const auto& pattern : h.pod_annotations) {
      auto forged = pod_annotation_cdi_witness(pattern);
      if (!forged) continue;
      out.push_back(
          {"containerd.pod-annotations-cdi", Severity::error,
           cat("runtime '", h.name, "' copies pod annotations matching \"", pattern,
               "\" into container specs: any pod can write a cdi.k8s.io/ annotation (e.g. \"",
               *forged,
               "\") and gpufence-runtime would take it for the device plugin's allocation"),
           cat(t.where, " pod_annotations = [..., \"", pattern, "\", ...]"),
           cat("remove \"", pattern, "\" from pod_annotations of [", in.table_of(h.name),
               "] (gpufence-runtime trusts cdi.k8s.io/ container annotations only because "
               "containerd does not copy pod annotations there; only the device plugin's "
               "Allocate answer may set them)")});
    }
  });
}

// CDI on (enable_cdi, or containerd 2.x's default) with no spec of the device plugin's kind:
// containerd resolves the plugin's CDI devices itself and fails every GPU pod at CreateContainer.
void check_cdi_no_gpu_spec(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  if (!in.options.host) return;
  const ContainerdConfig& cfg = in.cfg;
  CdiSettings cdi = cdi_settings(cfg);
  if (!cdi.enabled) return;
  auto specs = summarize_cdi_spec_files(read_cdi_spec_files(*in.options.host, cdi.spec_dirs));
  std::vector<std::string> gpu_specs, broken;
  for (const auto& s : specs) {
    if (s.kind != kCdiKind) continue;
    (s.error.empty() ? gpu_specs : broken).push_back(s.path);
  }
  if (!gpu_specs.empty()) return;
  std::string how = cdi.explicitly_set ? "enable_cdi = true"
                                       : "config version 3: containerd 2.x enables CDI by default";
  out.push_back(
      {"containerd.cdi-no-gpu-spec", Severity::error,
       cat("containerd resolves CDI devices itself (", how, ") but no CDI spec for ", kCdiKind,
           " is in cdi_spec_dirs: GPU pods fail with \"unresolvable CDI devices\""),
       cat(cfg.path, ": [plugins.\"", cri_plugin_name(cfg.version), "\"] ", how,
           "; cdi_spec_dirs = ", join(cdi.spec_dirs, ", "), "; ",
           broken.empty() ? cat("no ", kCdiKind, " spec there")
                          : cat(kCdiKind, " specs that do not parse: ", join(broken, ", "))),
       cat("gpufence-device-plugin writes its spec (", kCdiKind,
           ") into --cdi-spec-dir, default "
           "/var/run/cdi: run it with a directory in cdi_spec_dirs (",
           cdi.spec_dirs.empty() ? std::string("/var/run/cdi") : join(cdi.spec_dirs, ", "),
           "), or with a device strategy that does not use CDI")});
}

// A handler RuntimeClasses name with no runtime table: its pods fail to start.
void check_handler_missing(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  for (const auto& handler : in.options.handlers) {
    if (in.defines(handler)) continue;
    out.push_back({"containerd.handler-missing", Severity::error,
                   cat("RuntimeClass handler '", handler,
                       "' has no runtime in containerd's CRI config: pods using it fail to start"),
                   cat(in.cfg.path, ": no [", in.table_of(handler), "] table"),
                   cat("run: gpufence setup containerd --runtime-name ", handler,
                       " (adds the handler pointing at gpufence-runtime)")});
  }
}

// default_runtime_name must name a defined runtime, or the CRI plugin does not load. With no
// runtimes table in the file, containerd's built-in default (runc) still exists.
void check_default_runtime_undefined(const ConfigUnderCheck& in, std::vector<Finding>& out) {
  const ContainerdConfig& cfg = in.cfg;
  std::string def = default_runtime_name(cfg);
  const toml::table* containerd = cri_containerd_table(cfg);
  bool file_defines_runtimes = containerd && containerd->get_as<toml::table>("runtimes");
  bool template_variable =
      def.find("${") != std::string::npos;  // microk8s fills it in when it renders the template
  if (template_variable || in.defines(def) || (!file_defines_runtimes && def == "runc")) return;
  std::vector<std::string> names;
  for (const auto& t : in.cri) names.push_back(t.handler.name);
  out.push_back({"containerd.default-runtime-undefined", Severity::error,
                 cat("default_runtime_name = \"", def,
                     "\" names no defined runtime: containerd's CRI plugin fails to load"),
                 cat(cfg.path, ": [plugins.\"", cri_plugin_name(cfg.version),
                     "\".containerd] default_runtime_name = \"", def,
                     "\"; defined: ", names.empty() ? std::string("none") : join(names, ", ")),
                 cat("define [", in.table_of(def),
                     "] (runtime_type = \"io.containerd.runc.v2\") or set default_runtime_name "
                     "to a defined runtime")});
}

struct ContainerdCheck {
  std::string_view id;
  void (*run)(const ConfigUnderCheck&, std::vector<Finding>&);
};

// In the order they run: a report lists a config's findings by kind, in this order.
const std::vector<ContainerdCheck> kContainerdChecks = {
    {"containerd.runtime-under-v1-linux", check_runtime_under_v1_linux},
    {"containerd.runtime-engine-ignored", check_runtime_engine_ignored},
    {"containerd.unknown-runc-option", check_unknown_runc_option},
    {"containerd.handler-plain-runc", check_handler_plain_runc},
    {"containerd.binary-missing", check_binary_missing},
    {"containerd.handler-not-gpu-runtime", check_handler_not_gpu_runtime},
    {"containerd.handler-bypasses-binary", check_handler_bypasses_binary},
    {"containerd.pod-annotations-cdi", check_pod_annotations_cdi},
    {"containerd.cdi-no-gpu-spec", check_cdi_no_gpu_spec},
    {"containerd.handler-missing", check_handler_missing},
    {"containerd.default-runtime-undefined", check_default_runtime_undefined},
};

}  // namespace

const std::vector<std::string>& containerd_check_ids() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> out;
    for (const auto& c : kContainerdChecks) out.emplace_back(c.id);
    return out;
  }();
  return ids;
}

std::vector<Finding> check_containerd_config(const ContainerdConfig& cfg,
                                             const ContainerdCheckOptions& options) {
  const ConfigUnderCheck in = read_config_under_check(cfg, options);
  std::vector<Finding> out;
  for (const auto& check : kContainerdChecks) check.run(in, out);
  return out;
}

}  // namespace gpufence
