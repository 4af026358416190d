#include "runtime/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <set>

#include "cdi/spec.hpp"
#include "common/escape.hpp"
#include "common/file.hpp"

namespace gpufence {
namespace {

// A namespace name as the API server allows one (RFC 1123 label: 1-63 of [a-z0-9-], alphanumeric
// at both ends).
bool is_dns1123_label(std::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::ranges::all_of(
      s, [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

Result<std::vector<std::string>> string_array(const toml::node& node, std::string_view key) {
  const auto* arr = node.as_array();
  if (!arr) return fail(Errc::parse, key, " must be an array of strings");
  std::vector<std::string> out;
  for (const auto& item : *arr) {
    auto s = item.value<std::string>();
    if (!s) return fail(Errc::parse, key, " must be an array of strings");
    out.push_back(*s);
  }
  return out;
}

Result<std::string> string_value(const toml::node& node, std::string_view key) {
  auto s = node.value<std::string>();
  if (!s) return fail(Errc::parse, key, " must be a string");
  return *s;
}

// Applies one table's keys through `apply`; unknown keys are errors.
Status apply_table(const toml::table& table, std::string_view name,
                   const std::set<std::string, std::less<>>& known,
                   const std::function<Status(std::string_view, const toml::node&)>& apply) {
  for (const auto& [key, node] : table) {
    std::string full = cat(name, ".", key.str());
    if (!known.contains(key.str())) return fail(Errc::parse, "unknown key '", full, "'");
    if (auto st = apply(key.str(), node); !st) return std::unexpected(st.error().wrap(full));
  }
  return {};
}

}  // namespace

std::string_view channel_name(Channel channel) {
  switch (channel) {
    case Channel::none:
      return "none";
    case Channel::cdi_annotations:
      return "cdi-annotations";
    case Channel::device_specs:
      return "device-specs";
    case Channel::mount_markers:
      return "mount-markers";
    case Channel::envvar:
      return "envvar";
  }
  return "none";
}

bool RuntimeConfig::trusts(Channel c) const {
  return std::find(trusted_channels.begin(), trusted_channels.end(), c) != trusted_channels.end();
}

bool RuntimeConfig::is_listed_gpu_kind(std::string_view kind) const {
  return std::find(gpu_cdi_kinds.begin(), gpu_cdi_kinds.end(), kind) != gpu_cdi_kinds.end();
}

Status check_gpu_cdi_kind(std::string_view kind) {
  auto slash = kind.find('/');
  bool shaped = slash != std::string_view::npos && valid_cdi_vendor(kind.substr(0, slash)) &&
                valid_cdi_class(kind.substr(slash + 1));
  if (!shaped)
    return fail(Errc::parse, "'", escape_excerpt(kind),
                "' is not a CDI kind (vendor/class, e.g. k8s.gpu.nvidia.com/claim)");
  if (is_gpu_cdi_kind(kind))
    return fail(Errc::parse, "'", kind, "' is gpufence's own GPU kind, read without listing it");
  return {};
}

Result<RuntimeConfig> parse_runtime_config(std::string_view text, std::string_view origin) {
  toml::table doc;
  try {
    doc = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return fail(Errc::parse, origin, ":", where.line, ":", where.column, ": ", e.description());
  }
  RuntimeConfig cfg;
  auto in_file = [&](Status st) -> Status {
    if (!st) return std::unexpected(st.error().wrap(origin));
    return {};
  };
  for (const auto& [section, node] : doc) {
    const toml::table* table = node.as_table();
    if (!table)
      return fail(Errc::parse, origin, ": top-level key '", section.str(), "' must be a table");
    Status st;
    if (section == "runtime") {
      st = apply_table(*table, "runtime", {"low_level"},
                       [&](std::string_view, const toml::node& n) -> Status {
                         auto v = string_value(n, "value");
                         if (!v) return std::unexpected(v.error());
                         if (v->empty()) return fail(Errc::parse, "must not be empty");
                         cfg.low_level_runtime = *v;
                         return {};
                       });
    } else if (section == "log") {
      st = apply_table(*table, "log", {"file", "level"},
                       [&](std::string_view key, const toml::node& n) -> Status {
                         auto v = string_value(n, "value");
                         if (!v) return std::unexpected(v.error());
                         // The runtime runs in whatever directory containerd starts it in (the
                         // bundle): a relative log path would land there.
                         if (key == "file" && !v->empty() && v->front() != '/')
                           return fail(Errc::parse, "must be an absolute path or \"\"");
                         (key == "file" ? cfg.log_file : cfg.log_level) = *v;
                         return {};
                       });
    } else if (section == "allocation") {
      st = apply_table(
          *table, "allocation", {"trusted_channels", "privileged", "annotation_prefixes"},
          [&](std::string_view key, const toml::node& n) -> Status {
            if (key == "privileged") {
              auto v = string_value(n, "value");
              if (!v) return std::unexpected(v.error());
              if (*v == "isolate")
                cfg.all_devices_policy = AllDevicesPolicy::isolate;
              else if (*v == "passthrough")
                cfg.all_devices_policy = AllDevicesPolicy::passthrough;
              else
                return fail(Errc::parse, "'", *v, "' is not isolate or passthrough");
              return {};
            }
            auto list = string_array(n, "value");
            if (!list) return std::unexpected(list.error());
            if (key == "annotation_prefixes") {
              cfg.annotation_prefixes = *list;
              return {};
            }
            cfg.trusted_channels.clear();
            for (const auto& c : *list) {
              auto named =
                  std::find_if(std::begin(kSwitchableChannels), std::end(kSwitchableChannels),
                               [&](Channel ch) { return channel_name(ch) == c; });
              if (named == std::end(kSwitchableChannels))
                return fail(Errc::parse, "unknown channel '", c,
                            "' (cdi-annotations, mount-markers, envvar)");
              cfg.trusted_channels.push_back(*named);
            }
            return {};
          });
    } else if (section == "devices") {
      st = apply_table(*table, "devices", {"root", "control_nodes", "nvml_library"},
                       [&](std::string_view key, const toml::node& n) -> Status {
                         if (key == "control_nodes") {
                           auto list = string_array(n, "value");
                           if (!list) return std::unexpected(list.error());
                           cfg.control_nodes = *list;
                           return {};
                         }
                         auto v = string_value(n, "value");
                         if (!v) return std::unexpected(v.error());
                         (key == "root" ? cfg.device_root : cfg.nvml_library) = *v;
                         return {};
                       });
    } else if (section == "cdi") {
      st = apply_table(*table, "cdi", {"spec_dirs", "gpu_kinds"},
                       [&](std::string_view key, const toml::node& n) -> Status {
                         auto list = string_array(n, "value");
                         if (!list) return std::unexpected(list.error());
                         if (key == "spec_dirs") {
                           cfg.cdi_spec_dirs = *list;
                           return {};
                         }
                         for (const auto& kind : *list)
                           if (auto st = check_gpu_cdi_kind(kind); !st) return st;
                         cfg.gpu_cdi_kinds = *list;
                         return {};
                       });
    } else if (section == "driver") {
      st = apply_table(*table, "driver", {"procfs_gpus_dir"},
                       [&](std::string_view, const toml::node& n) -> Status {
                         auto v = string_value(n, "value");
                         if (!v) return std::unexpected(v.error());
                         if (v->empty() || v->front() != '/')
                           return fail(Errc::parse, "must be an absolute path");
                         cfg.procfs_gpus_dir = *v;
                         return {};
                       });
    } else if (section == "nri") {
      st = apply_table(
          *table, "nri", {"status_file", "keeper_dir", "socket", "node_agent_namespaces"},
          [&](std::string_view key, const toml::node& n) -> Status {
            if (key == "node_agent_namespaces") {
              auto list = string_array(n, "value");
              if (!list) return std::unexpected(list.error());
              for (const auto& ns : *list)
                if (!is_dns1123_label(ns))
                  return fail(Errc::parse, "'", escape_excerpt(ns),
                              "' is not a Kubernetes namespace name");
              cfg.nri_node_agent_namespaces = *list;
              return {};
            }
            auto v = string_value(n, "value");
            if (!v) return std::unexpected(v.error());
            if (key == "socket" ? v->empty() || v->front() != '/'
                                : !v->empty() && v->front() != '/')
              return fail(Errc::parse, key == "socket" ? "must be an absolute path"
                                                       : "must be an absolute path or \"\"");
            (key == "status_file"  ? cfg.nri_status_file
             : key == "keeper_dir" ? cfg.nri_keeper_dir
                                   : cfg.nri_socket) = *v;
            return {};
          });
    } else {
      return fail(Errc::parse, origin, ": unknown section [", section.str(), "]");
    }
    if (auto r = in_file(st); !r) return std::unexpected(r.error());
  }
  return cfg;
}

Result<RuntimeConfig> load_runtime_config() {
  const char* env = std::getenv(kRuntimeConfigEnv);
  bool explicit_path = env && *env;
  std::string path = explicit_path ? env : kRuntimeConfigPath;
  auto text = read_file(path);
  if (!text) {
    if (text.error().code == Errc::not_found && !explicit_path) return RuntimeConfig{};
    return std::unexpected(text.error().wrap("read runtime config"));
  }
  return parse_runtime_config(*text, path);
}

}  // namespace gpufence
