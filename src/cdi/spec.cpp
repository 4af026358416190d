#include "cdi/spec.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <set>

#include "common/strings.hpp"

namespace gpufence {
namespace {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Syntax: JSON or YAML into one document type.

// YAML -> JSON, so one decoder serves both (scalars stay strings unless they look like numbers
// or booleans, which is how YAML 1.2's core schema reads them; quoted scalars stay strings).
Json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return s;
      if (s == "true") return true;
      if (s == "false") return false;
      if (s == "~" || s == "null") return nullptr;
      if (auto n = parse_number<long long>(s)) return *n;
      if (!s.empty() && s.front() == '-') {
        // parse_number takes no sign; negative numbers matter (major: -1 must be rejected as a
        // negative number, not as a string).
        if (auto n = parse_number<long long>(std::string_view(s).substr(1))) return -*n;
      }
      return s;
    }
    case YAML::NodeType::Sequence: {
      Json arr = Json::array();
      for (const auto& item : node) arr.push_back(yaml_to_json(item));
      return arr;
    }
    case YAML::NodeType::Map: {
      Json obj = Json::object();
      for (const auto& kv : node) {
        auto key = kv.first.as<std::string>();
        // Upstream reads strictly (yaml.UnmarshalStrict): a key given twice is an error, not
        // "the last one wins".
        if (obj.contains(key))
          throw YAML::ParserException(kv.first.Mark(), "duplicate key '" + key + "'");
        obj[key] = yaml_to_json(kv.second);
      }
      return obj;
    }
    default:
      return nullptr;
  }
}

// ---------------------------------------------------------------------------------------------
// Typed decode. Each reader names the field by its path in the document
// ("devices[0].containerEdits.deviceNodes[1].major"); the first error wins.

enum class Required { yes, no };

std::string type_name(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "a map";
  return "null";
}

class Decoder {
 public:
  explicit Decoder(std::string origin) : m_origin(std::move(origin)) {}

  bool ok() const { return m_error.empty(); }
  Error error() const { return Error{Errc::parse, m_origin + ": " + m_error}; }

  void fail(const std::string& path, const std::string& msg) {
    if (m_error.empty()) m_error = path.empty() ? msg : path + " " + msg;
  }

  // A map whose keys are all in `fields`. Null reads as an empty map.
  bool map(const Json& v, const std::string& path, std::initializer_list<const char*> fields) {
    if (v.is_null()) return true;
    if (!v.is_object()) {
      fail(path.empty() ? "the document" : path, "must be a map, not " + type_name(v));
      return false;
    }
    for (const auto& [k, unused] : v.items()) {
      if (std::none_of(fields.begin(), fields.end(), [&](const char* f) { return k == f; })) {
        fail(join_path(path, k), "is not a field of the CDI spec");
        return false;
      }
    }
    return true;
  }

  std::string str(const Json& obj, const char* key, const std::string& path,
                  Required required = Required::no) {
    const Json* v = find(obj, key);
    if (!v) {
      if (required == Required::yes) fail(join_path(path, key), "is required");
      return "";
    }
    if (!v->is_string()) {
      std::string hint = v->is_number() ? " (YAML reads an unquoted number as one: quote it)" : "";
      fail(join_path(path, key), "must be a string, not " + type_name(*v) + hint);
      return "";
    }
    return v->get<std::string>();
  }

  std::vector<std::string> strings(const Json& obj, const char* key, const std::string& path) {
    std::vector<std::string> out;
    const Json* v = list(obj, key, path);
    if (!v) return out;
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& item = (*v)[i];
      if (!item.is_string()) {
        fail(cat(join_path(path, key), "[", i, "]"), "must be a string, not " + type_name(item));
        return out;
      }
      out.push_back(item.get<std::string>());
    }
    return out;
  }

  template <class T>
  std::optional<T> integer(const Json& obj, const char* key, const std::string& path) {
    const Json* v = find(obj, key);
    if (!v) return std::nullopt;
    auto n = integer_value<T>(*v);
    if (!n) {
      fail(join_path(path, key), cat("must be an integer from ", +std::numeric_limits<T>::min(),
                                     " to ", +std::numeric_limits<T>::max(), ", not ",
                                     v->is_number() ? v->dump() : type_name(*v)));
    }
    return n;
  }

  template <class T>
  std::vector<T> integers(const Json& obj, const char* key, const std::string& path) {
    std::vector<T> out;
    const Json* v = list(obj, key, path);
    if (!v) return out;
    for (size_t i = 0; i < v->size(); ++i) {
      auto n = integer_value<T>((*v)[i]);
      if (!n) {
        fail(cat(join_path(path, key), "[", i, "]"),
             cat("must be an integer from ", +std::numeric_limits<T>::min(), " to ",
                 +std::numeric_limits<T>::max()));
        return out;
      }
      out.push_back(*n);
    }
    return out;
  }

  bool boolean(const Json& obj, const char* key, const std::string& path) {
    const Json* v = find(obj, key);
    if (!v) return false;
    if (!v->is_boolean()) {
      fail(join_path(path, key), "must be true or false, not " + type_name(*v));
      return false;
    }
    return v->get<bool>();
  }

  std::map<std::string, std::string> string_map(const Json& obj, const char* key,
                                                const std::string& path) {
    std::map<std::string, std::string> out;
    const Json* v = find(obj, key);
    if (!v) return out;
    if (!v->is_object()) {
      fail(join_path(path, key), "must be a map of strings, not " + type_name(*v));
      return out;
    }
    for (const auto& [k, value] : v->items()) {
      if (!value.is_string()) {
        fail(join_path(join_path(path, key), k), "must be a string, not " + type_name(value));
        return out;
      }
      out[k] = value.get<std::string>();
    }
    return out;
  }

  // The list at `key`, or nullptr when absent or null (an error when not a list).
  const Json* list(const Json& obj, const char* key, const std::string& path) {
    const Json* v = find(obj, key);
    if (!v) return nullptr;
    if (!v->is_array()) {
      fail(join_path(path, key), "must be a list, not " + type_name(*v));
      return nullptr;
    }
    return v;
  }

  static const Json* find(const Json& obj, const char* key) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }

  static std::string join_path(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : cat(path, ".", key);
  }

 private:
  template <class T>
  static std::optional<T> integer_value(const Json& v) {
    if (v.is_number_unsigned()) {
      auto u = v.get<unsigned long long>();
      if (u > static_cast<unsigned long long>(std::numeric_limits<T>::max())) return std::nullopt;
      return static_cast<T>(u);
    }
    if (v.is_number_integer()) {
      auto s = v.get<long long>();
      if (s < static_cast<long long>(std::numeric_limits<T>::min())) return std::nullopt;
      if (s > 0 && static_cast<unsigned long long>(s) >
                       static_cast<unsigned long long>(std::numeric_limits<T>::max())) {
        return std::nullopt;
      }
      return static_cast<T>(s);
    }
    return std::nullopt;
  }

  std::string m_origin;
  std::string m_error;
};

CdiContainerEdits decode_edits(Decoder& d, const Json& obj, const std::string& path) {
  CdiContainerEdits e;
  if (!d.map(
          obj, path,
          {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"})) {
    return e;
  }
  e.env = d.strings(obj, "env", path);
  if (const Json* nodes = d.list(obj, "deviceNodes", path)) {
    for (size_t i = 0; i < nodes->size() && d.ok(); ++i) {
      const Json& n = (*nodes)[i];
      std::string at = cat(path, ".deviceNodes[", i, "]");
      if (!d.map(n, at,
                 {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid",
                  "gid"})) {
        break;
      }
      CdiDeviceNode dn;
      dn.path = d.str(n, "path", at, Required::yes);
      dn.host_path = d.str(n, "hostPath", at);
      dn.type = d.str(n, "type", at);
      dn.major = d.integer<long long>(n, "major", at);
      dn.minor = d.integer<long long>(n, "minor", at);
      dn.file_mode = d.integer<std::uint32_t>(n, "fileMode", at);
      dn.permissions = d.str(n, "permissions", at);
      dn.uid = d.integer<std::uint32_t>(n, "uid", at);
      dn.gid = d.integer<std::uint32_t>(n, "gid", at);
      e.device_nodes.push_back(std::move(dn));
    }
  }
  if (const Json* mounts = d.list(obj, "mounts", path)) {
    for (size_t i = 0; i < mounts->size() && d.ok(); ++i) {
      const Json& m = (*mounts)[i];
      std::string at = cat(path, ".mounts[", i, "]");
      if (!d.map(m, at, {"hostPath", "containerPath", "options", "type"})) break;
      e.mounts.push_back({d.str(m, "hostPath", at, Required::yes),
                          d.str(m, "containerPath", at, Required::yes), d.strings(m, "options", at),
                          d.str(m, "type", at)});
    }
  }
  if (const Json* hooks = d.list(obj, "hooks", path)) {
    for (size_t i = 0; i < hooks->size() && d.ok(); ++i) {
      const Json& h = (*hooks)[i];
      std::string at = cat(path, ".hooks[", i, "]");
      if (!d.map(h, at, {"hookName", "path", "args", "env", "timeout"})) break;
      e.hooks.push_back({d.str(h, "hookName", at, Required::yes),
                         d.str(h, "path", at, Required::yes), d.strings(h, "args", at),
                         d.strings(h, "env", at), d.integer<int>(h, "timeout", at)});
    }
  }
  e.additional_gids = d.integers<std::uint32_t>(obj, "additionalGids", path);
  if (const Json* rdt = Decoder::find(obj, "intelRdt")) {
    std::string at = path + ".intelRdt";
    if (d.map(*rdt, at,
              {"closID", "l3CacheSchema", "memBwSchema", "schemata", "enableCMT", "enableMBM",
               "enableMonitoring"})) {
      CdiIntelRdt r;
      r.clos_id = d.str(*rdt, "closID", at);
      r.l3_cache_schema = d.str(*rdt, "l3CacheSchema", at);
      r.mem_bw_schema = d.str(*rdt, "memBwSchema", at);
      if (Decoder::find(*rdt, "schemata")) r.schemata = d.strings(*rdt, "schemata", at);
      r.enable_cmt = d.boolean(*rdt, "enableCMT", at);
      r.enable_mbm = d.boolean(*rdt, "enableMBM", at);
      r.enable_monitoring = d.boolean(*rdt, "enableMonitoring", at);
      e.intel_rdt = std::move(r);
    }
  }
  if (const Json* nets = d.list(obj, "netDevices", path)) {
    for (size_t i = 0; i < nets->size() && d.ok(); ++i) {
      const Json& n = (*nets)[i];
      std::string at = cat(path, ".netDevices[", i, "]");
      if (!d.map(n, at, {"hostInterfaceName", "name"})) break;
      e.net_devices.push_back({d.str(n, "hostInterfaceName", at), d.str(n, "name", at)});
    }
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// Writing.

Json edits_to_json(const CdiContainerEdits& e) {
  Json j = Json::object();
  if (!e.env.empty()) j["env"] = e.env;
  if (!e.device_nodes.empty()) {
    j["deviceNodes"] = Json::array();
    for (const auto& d : e.device_nodes) {
      Json n;
      n["path"] = d.path;
      if (!d.host_path.empty()) n["hostPath"] = d.host_path;
      if (!d.type.empty()) n["type"] = d.type;
      if (d.major) n["major"] = *d.major;
      if (d.minor) n["minor"] = *d.minor;
      if (d.file_mode) n["fileMode"] = *d.file_mode;
      if (!d.permissions.empty()) n["permissions"] = d.permissions;
      if (d.uid) n["uid"] = *d.uid;
      if (d.gid) n["gid"] = *d.gid;
      j["deviceNodes"].push_back(n);
    }
  }
  if (!e.mounts.empty()) {
    j["mounts"] = Json::array();
    for (const auto& m : e.mounts) {
      Json n;
      n["hostPath"] = m.host_path;
      n["containerPath"] = m.container_path;
      if (!m.options.empty()) n["options"] = m.options;
      if (!m.type.empty()) n["type"] = m.type;
      j["mounts"].push_back(n);
    }
  }
  if (!e.hooks.empty()) {
    j["hooks"] = Json::array();
    for (const auto& h : e.hooks) {
      Json n;
      n["hookName"] = h.hook_name;
      n["path"] = h.path;
      if (!h.args.empty()) n["args"] = h.args;
      if (!h.env.empty()) n["env"] = h.env;
      if (h.timeout) n["timeout"] = *h.timeout;
      j["hooks"].push_back(n);
    }
  }
  if (!e.additional_gids.empty()) j["additionalGids"] = e.additional_gids;
  if (e.intel_rdt) {
    const auto& r = *e.intel_rdt;
    Json n = Json::object();
    if (!r.clos_id.empty()) n["closID"] = r.clos_id;
    if (!r.l3_cache_schema.empty()) n["l3CacheSchema"] = r.l3_cache_schema;
    if (!r.mem_bw_schema.empty()) n["memBwSchema"] = r.mem_bw_schema;
    if (r.schemata) n["schemata"] = *r.schemata;
    if (r.enable_cmt) n["enableCMT"] = true;
    if (r.enable_mbm) n["enableMBM"] = true;
    if (r.enable_monitoring) n["enableMonitoring"] = true;
    j["intelRdt"] = n;
  }
  if (!e.net_devices.empty()) {
    j["netDevices"] = Json::array();
    for (const auto& n : e.net_devices)
      j["netDevices"].push_back({{"hostInterfaceName", n.host_interface_name}, {"name", n.name}});
  }
  return j;
}

void emit_yaml(YAML::Emitter& out, const Json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit_yaml(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& v : j) emit_yaml(out, v);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    // Quote strings that YAML would read as something else ("0", "true", "1.0").
    const auto& s = j.get_ref<const std::string&>();
    bool ambiguous = parse_number<long long>(s).has_value() || s == "true" || s == "false" ||
                     s == "null" || s == "~" || s.empty() ||
                     (s.front() == '-' && parse_number<long long>(s.substr(1)).has_value()) ||
                     s.find_first_of(":#{}[],&*!|>'\"%@`") != std::string::npos;
    if (ambiguous)
      out << YAML::DoubleQuoted << s;
    else
      out << s;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_unsigned()) {
    out << j.get<unsigned long long>();
  } else if (j.is_number_integer()) {
    out << j.get<long long>();
  } else {
    out << YAML::Null;
  }
}

// ---------------------------------------------------------------------------------------------
// Rules. Each cites its upstream source in docs/cdi.md.

bool is_letter(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}
bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool is_alnum(unsigned char c) {
  return is_letter(c) || is_digit(c);
}

// pkg/parser validateVendorOrClassName: a letter first, a letter or digit last, letters, digits,
// '_', '-' and '.' between.
bool valid_vendor_or_class(std::string_view v) {
  if (v.empty() || !is_letter(v.front()) || !is_alnum(v.back())) return false;
  return std::all_of(v.begin(), v.end(), [](unsigned char c) {
    return is_alnum(c) || c == '-' || c == '_' || c == '.';
  });
}

// Normalised version ("v0.6.0" -> "0.6.0", as upstream's newVersion does) and its rank.
int version_rank(std::string_view v) {
  if (v.starts_with('v')) v.remove_prefix(1);
  auto it = std::find(kCdiVersions.begin(), kCdiVersions.end(), v);
  return it == kCdiVersions.end() ? -1 : static_cast<int>(it - kCdiVersions.begin());
}

// k8s.io/apimachinery IsQualifiedName, as CDI's ValidateSpecAnnotations applies it (on the
// lowercased key): [prefix/]name, prefix a DNS-1123 subdomain, name up to 63 characters of
// [A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9].
bool valid_dns1123_subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (auto label : split(s, '.')) {
    if (label.empty() || !is_alnum(label.front()) || !is_alnum(label.back())) return false;
    for (unsigned char c : label) {
      if (!(is_digit(c) || (c >= 'a' && c <= 'z') || c == '-')) return false;
    }
  }
  return true;
}

bool valid_qualified_name(std::string_view key) {
  std::string lower = to_lower(key);
  std::string_view name = lower;
  if (auto slash = name.find('/'); slash != std::string_view::npos) {
    if (!valid_dns1123_subdomain(name.substr(0, slash))) return false;
    name = name.substr(slash + 1);
  }
  if (name.empty() || name.size() > 63 || !is_alnum(name.front()) || !is_alnum(name.back()))
    return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return is_alnum(c) || c == '-' || c == '_' || c == '.';
  });
}

Status validate_annotations(const std::map<std::string, std::string>& annotations,
                            const std::string& where) {
  size_t total = 0;
  for (const auto& [k, v] : annotations) {
    if (!valid_qualified_name(k)) {
      return fail(Errc::parse, where, "annotations: key '", k,
                  "' is not a qualified name ([prefix/]name, name up to 63 of [A-Za-z0-9-_.])");
    }
    total += k.size() + v.size();
  }
  if (total > 256 * 1024)
    return fail(Errc::parse, where, "annotations: larger than 256 KiB (", total, " bytes)");
  return {};
}

// upstream ValidateEnv: an '=' after at least one character.
bool valid_env_entry(std::string_view e) {
  auto eq = e.find('=');
  return eq != std::string_view::npos && eq > 0;
}

bool absolute(std::string_view p) {
  return !p.empty() && p.front() == '/';
}

Status validate_edits(const CdiContainerEdits& e, const std::string& where) {
  for (const auto& env : e.env) {
    if (!valid_env_entry(env))
      return fail(Errc::parse, where, "env entry '", env, "' is not KEY=VALUE");
  }
  for (size_t i = 0; i < e.device_nodes.size(); ++i) {
    const auto& d = e.device_nodes[i];
    std::string at = cat(where, "deviceNodes[", i, "]");
    if (!absolute(d.path)) return fail(Errc::parse, at, ": path '", d.path, "' must be absolute");
    if (!d.host_path.empty() && !absolute(d.host_path))
      return fail(Errc::parse, at, ": hostPath '", d.host_path, "' must be absolute");
    if (!d.type.empty() && d.type != "c" && d.type != "b" && d.type != "u" && d.type != "p")
      return fail(Errc::parse, at, ": type '", d.type, "' is not b, c, u or p");
    if ((d.major && *d.major < 0) || (d.minor && *d.minor < 0)) {
      // -1 would read as a wildcard in a device cgroup rule.
      return fail(Errc::parse, at, ": major and minor must not be negative");
    }
    if (d.permissions != "none" && d.permissions.find_first_not_of("rwm") != std::string::npos) {
      return fail(Errc::parse, at, ": permissions '", d.permissions,
                  "' may hold only r, w, m (or be \"none\")");
    }
  }
  for (size_t i = 0; i < e.mounts.size(); ++i) {
    const auto& m = e.mounts[i];
    std::string at = cat(where, "mounts[", i, "]");
    if (m.host_path.empty()) return fail(Errc::parse, at, ": hostPath is empty");
    if (!absolute(m.container_path))
      return fail(Errc::parse, at, ": containerPath '", m.container_path, "' must be absolute");
  }
  static const std::set<std::string, std::less<>> hook_names = {
      "prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"};
  for (size_t i = 0; i < e.hooks.size(); ++i) {
    const auto& h = e.hooks[i];
    std::string at = cat(where, "hooks[", i, "]");
    if (!hook_names.contains(h.hook_name))
      return fail(Errc::parse, at, ": unknown hookName '", h.hook_name, "'");
    if (!absolute(h.path)) return fail(Errc::parse, at, ": path '", h.path, "' must be absolute");
    for (const auto& env : h.env) {
      if (!valid_env_entry(env))
        return fail(Errc::parse, at, ": env entry '", env, "' is not KEY=VALUE");
    }
    if (h.timeout && *h.timeout <= 0)
      return fail(Errc::parse, at, ": timeout must be greater than zero");
  }
  if (e.intel_rdt) {
    const std::string& c = e.intel_rdt->clos_id;
    if (c != "/" && (c.size() >= 4096 || c == "." || c == ".." ||
                     c.find_first_of("/\n") != std::string::npos)) {
      return fail(Errc::parse, where, "intelRdt: closID '", c, "' is not a valid file name");
    }
  }
  std::set<std::string> host_names, names;
  for (size_t i = 0; i < e.net_devices.size(); ++i) {
    const auto& n = e.net_devices[i];
    std::string at = cat(where, "netDevices[", i, "]");
    if (n.host_interface_name.empty()) return fail(Errc::parse, at, ": hostInterfaceName is empty");
    if (n.name.empty()) return fail(Errc::parse, at, ": name is empty");
    if (!host_names.insert(n.host_interface_name).second)
      return fail(Errc::parse, at, ": hostInterfaceName '", n.host_interface_name, "' twice");
    if (!names.insert(n.name).second) return fail(Errc::parse, at, ": name '", n.name, "' twice");
  }
  return {};
}

// specs-go validateVersionedIntelRdt: enableCMT and enableMBM were dropped in 1.1.0.
Status validate_versioned_fields(const CdiContainerEdits& e, int rank, const std::string& where) {
  if (e.intel_rdt && rank >= version_rank("1.1.0") &&
      (e.intel_rdt->enable_cmt || e.intel_rdt->enable_mbm)) {
    return fail(Errc::parse, where, "intelRdt: enableCMT and enableMBM are not valid from 1.1.0");
  }
  return {};
}

}  // namespace

bool valid_cdi_vendor(std::string_view vendor) {
  return valid_vendor_or_class(vendor);
}
bool valid_cdi_class(std::string_view cls) {
  return valid_vendor_or_class(cls);
}

// pkg/parser ValidateDeviceName: a letter or digit first and last, letters, digits, '_', '-',
// '.' and ':' between.
bool valid_cdi_device_name(std::string_view n) {
  if (n.empty() || !is_alnum(n.front()) || !is_alnum(n.back())) return false;
  return std::all_of(n.begin(), n.end(), [](unsigned char c) {
    return is_alnum(c) || c == '-' || c == '_' || c == '.' || c == ':';
  });
}

Result<CdiDocument> parse_cdi_document(std::string_view text, std::string_view origin) {
  // JSON first: nlohmann is several times faster than yaml-cpp on the same text, and the shim
  // reads these files on every create. YAML (a superset) reports syntax errors with a position.
  auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    // Keys of each open object, to refuse a duplicate as the YAML reader does.
    std::vector<std::set<std::string>> keys;
    std::string duplicate;
    auto strict = [&](int, nlohmann::json::parse_event_t event, Json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (event == E::object_start) keys.emplace_back();
      if (event == E::object_end && !keys.empty()) keys.pop_back();
      if (event == E::key && !keys.empty() &&
          !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    };
    try {
      Json doc = Json::parse(text, strict);
      if (!duplicate.empty()) return fail(Errc::parse, origin, ": duplicate key '", duplicate, "'");
      return doc;
    } catch (const nlohmann::json::exception& e) {
      // parse_error, or out_of_range for a number that overflows (found by the fuzzer:
      // tests/fuzz/corpus/cdi_spec/crash-number-overflow).
      // A .json file is JSON: report where it broke, without the library's exception tag. Any
      // other file may be YAML in flow style; let the YAML reader judge it.
      if (origin.ends_with(".json")) {
        std::string_view what = e.what();
        if (auto tag = what.find("] "); tag != std::string_view::npos) what.remove_prefix(tag + 2);
        return fail(Errc::parse, origin, ": not JSON: ", what);
      }
    }
  }
  try {
    return yaml_to_json(YAML::Load(std::string(text)));
  } catch (const YAML::Exception& e) {
    return fail(Errc::parse, origin, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg);
  }
}

std::optional<std::string> cdi_document_kind(const CdiDocument& doc) {
  const Json* kind = Decoder::find(doc, "kind");
  if (!kind || !kind->is_string()) return std::nullopt;
  return kind->get<std::string>();
}

Result<CdiSpec> decode_cdi_spec(const CdiDocument& doc, std::string_view origin) {
  Decoder d{std::string(origin)};
  if (!doc.is_object()) return fail(Errc::parse, origin, ": not a CDI spec (expected a map)");
  d.map(doc, "", {"cdiVersion", "kind", "annotations", "devices", "containerEdits"});
  CdiSpec spec;
  spec.cdi_version = d.str(doc, "cdiVersion", "", Required::yes);
  spec.kind = d.str(doc, "kind", "", Required::yes);
  spec.annotations = d.string_map(doc, "annotations", "");
  if (const Json* devices = d.list(doc, "devices", "")) {
    for (size_t i = 0; i < devices->size() && d.ok(); ++i) {
      const Json& dev = (*devices)[i];
      std::string at = cat("devices[", i, "]");
      if (!d.map(dev, at, {"name", "annotations", "containerEdits"})) break;
      CdiDevice out;
      out.name = d.str(dev, "name", at, Required::yes);
      out.annotations = d.string_map(dev, "annotations", at);
      if (const Json* e = Decoder::find(dev, "containerEdits"))
        out.edits = decode_edits(d, *e, at + ".containerEdits");
      spec.devices.push_back(std::move(out));
    }
  }
  // An empty or null spec-wide containerEdits is valid: upstream reads it as no edits.
  if (const Json* e = Decoder::find(doc, "containerEdits"))
    spec.edits = decode_edits(d, *e, "containerEdits");
  if (!d.ok()) return std::unexpected(d.error());
  if (auto st = validate_cdi_spec(spec); !st)
    return std::unexpected(st.error().wrap(std::string(origin)));
  return spec;
}

Result<CdiSpec> parse_cdi_spec(std::string_view text, std::string_view origin) {
  auto doc = parse_cdi_document(text, origin);
  if (!doc) return std::unexpected(doc.error());
  return decode_cdi_spec(*doc, origin);
}

nlohmann::ordered_json cdi_spec_to_json(const CdiSpec& spec) {
  Json j;
  j["cdiVersion"] = spec.cdi_version;
  j["kind"] = spec.kind;
  if (!spec.annotations.empty()) j["annotations"] = spec.annotations;
  j["devices"] = Json::array();
  for (const auto& d : spec.devices) {
    Json dev;
    dev["name"] = d.name;
    if (!d.annotations.empty()) dev["annotations"] = d.annotations;
    dev["containerEdits"] = edits_to_json(d.edits);
    j["devices"].push_back(dev);
  }
  if (!spec.edits.empty()) j["containerEdits"] = edits_to_json(spec.edits);
  return j;
}

std::string cdi_spec_to_yaml(const CdiSpec& spec) {
  YAML::Emitter out;
  emit_yaml(out, cdi_spec_to_json(spec));
  return std::string(out.c_str()) + "\n";
}

// specs-go version.go, requiresV040 ... requiresV110: the newest version whose feature the spec
// uses; 0.3.0 (vEarliest) when none.
std::string minimum_cdi_version(const CdiSpec& spec) {
  int need = version_rank("0.3.0");
  auto require = [&](const char* v) { need = std::max(need, version_rank(v)); };
  auto edits = [&](const CdiContainerEdits& e) {
    for (const auto& m : e.mounts) {
      if (!m.type.empty()) require("0.4.0");  // Mount.Type
    }
    for (const auto& d : e.device_nodes) {
      if (!d.host_path.empty()) require("0.5.0");  // DeviceNode.HostPath
    }
    if (e.intel_rdt || !e.additional_gids.empty()) require("0.7.0");
    if (e.intel_rdt && (e.intel_rdt->schemata || e.intel_rdt->enable_monitoring)) require("1.1.0");
    if (!e.net_devices.empty()) require("1.1.0");
  };
  edits(spec.edits);
  for (const auto& d : spec.devices) {
    edits(d.edits);
    if (!d.name.empty() && is_digit(d.name.front())) require("0.5.0");  // "0", not only "gpu0"
    if (!d.annotations.empty()) require("0.6.0");
  }
  if (!spec.annotations.empty()) require("0.6.0");
  // A dot in the class ("example.com/net.x") is 0.6.0; the vendor had dots before.
  if (auto slash = spec.kind.find('/');
      slash != std::string::npos && spec.kind.find('.', slash + 1) != std::string::npos) {
    require("0.6.0");
  }
  return kCdiVersions[static_cast<size_t>(need)];
}

// Order as upstream's Spec.validate: version, kind, annotations, spec-wide edits, devices.
Status validate_cdi_spec(const CdiSpec& spec) {
  int rank = version_rank(spec.cdi_version);
  if (rank < 0) {
    return fail(Errc::parse, "cdiVersion '", spec.cdi_version, "' is not a CDI version (",
                kCdiVersions.front(), " to ", kCdiVersions.back(), ")");
  }
  std::string need = minimum_cdi_version(spec);
  if (rank < version_rank(need)) {
    return fail(Errc::parse, "cdiVersion ", spec.cdi_version,
                " is too old for what the spec uses (needs ", need, ")");
  }
  auto slash = spec.kind.find('/');
  if (slash == std::string::npos) {
    return fail(Errc::parse, "kind '", spec.kind, "' is not vendor/class (e.g. nvidia.com/gpu)");
  }
  std::string_view vendor = std::string_view(spec.kind).substr(0, slash);
  std::string_view cls = std::string_view(spec.kind).substr(slash + 1);
  if (!valid_cdi_vendor(vendor)) {
    return fail(Errc::parse, "kind '", spec.kind, "' is not vendor/class: vendor '", vendor,
                "' must start with a letter, end with a letter or digit, and hold only letters, "
                "digits, '-', '_' and '.'");
  }
  if (!valid_cdi_class(cls)) {
    return fail(Errc::parse, "kind '", spec.kind, "' is not vendor/class: class '", cls,
                "' must start with a letter, end with a letter or digit, and hold only letters, "
                "digits, '-', '_' and '.'");
  }
  if (auto st = validate_annotations(spec.annotations, ""); !st) return st;
  if (auto st = validate_edits(spec.edits, "containerEdits."); !st) return st;
  if (auto st = validate_versioned_fields(spec.edits, rank, "containerEdits."); !st) return st;
  std::set<std::string> names;
  for (const auto& d : spec.devices) {
    if (!names.insert(d.name).second)
      return fail(Errc::parse, "device '", d.name, "' is defined twice");
    if (!valid_cdi_device_name(d.name)) {
      return fail(Errc::parse, "device name '", d.name,
                  "' is invalid (a letter or digit first and last; letters, digits, '-', '_', "
                  "'.' and ':' between)");
    }
    std::string where = cat("device '", d.name, "': ");
    if (auto st = validate_annotations(d.annotations, where); !st) return st;
    if (d.edits.empty()) return fail(Errc::parse, "device '", d.name, "' has no containerEdits");
    if (auto st = validate_edits(d.edits, where + "containerEdits."); !st) return st;
    if (auto st = validate_versioned_fields(d.edits, rank, where + "containerEdits."); !st)
      return st;
  }
  if (spec.devices.empty()) return fail(Errc::parse, "spec has no devices");
  return {};
}

}  // namespace gpufence
