#include "cdi/spec.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "common/strings.hpp"

namespace gpufence {
namespace {

using Json = nlohmann::ordered_json;

// YAML -> JSON, so one decoder serves both (scalars stay strings unless they look like numbers
// or booleans, which is how YAML 1.2's core schema reads them).
Json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!") return s;  // quoted
      if (s == "true") return true;
      if (s == "false") return false;
      if (auto n = parse_number<long long>(s)) return *n;
      return s;
    }
    case YAML::NodeType::Sequence: {
      Json arr = Json::array();
      for (const auto& item : node) arr.push_back(yaml_to_json(item));
      return arr;
    }
    case YAML::NodeType::Map: {
      Json obj = Json::object();
      for (const auto& kv : node) obj[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return obj;
    }
    default:
      return nullptr;
  }
}

// Typed field readers that name the field on error.
struct Reader {
  std::string where;
  Status error;  // first error seen

  void fail_with(const std::string& msg) {
    if (error) error = std::unexpected(Error{Errc::parse, where + ": " + msg});
  }
  std::string str(const Json& obj, const char* key, bool required = false) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) fail_with(cat("missing required field '", key, "'"));
      return "";
    }
    if (!it->is_string()) {
      fail_with(cat("field '", key, "' must be a string"));
      return "";
    }
    return it->get<std::string>();
  }
  std::vector<std::string> strings(const Json& obj, const char* key) {
    std::vector<std::string> out;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return out;
    if (!it->is_array()) {
      fail_with(cat("field '", key, "' must be a list of strings"));
      return out;
    }
    for (const auto& v : *it) {
      if (!v.is_string()) {
        fail_with(cat("field '", key, "' must be a list of strings"));
        return out;
      }
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  template <class T>
  std::optional<T> number(const Json& obj, const char* key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer()) {
      fail_with(cat("field '", key, "' must be an integer"));
      return std::nullopt;
    }
    return it->get<T>();
  }
  std::map<std::string, std::string> string_map(const Json& obj, const char* key) {
    std::map<std::string, std::string> out;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return out;
    if (!it->is_object()) {
      fail_with(cat("field '", key, "' must be a map of strings"));
      return out;
    }
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string())
        fail_with(cat("annotation '", k, "' must be a string"));
      else
        out[k] = v.get<std::string>();
    }
    return out;
  }
  void only(const Json& obj, std::initializer_list<const char*> allowed, const std::string& what) {
    if (!obj.is_object()) {
      fail_with(what + " must be a map");
      return;
    }
    for (const auto& [k, v] : obj.items()) {
      if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; })) {
        fail_with(cat(what, ": field '", k, "' is unknown or not supported by gpufence"));
      }
    }
  }
};

CdiContainerEdits read_edits(Reader& r, const Json& obj) {
  CdiContainerEdits e;
  r.only(obj, {"env", "deviceNodes", "mounts", "hooks"}, "containerEdits");
  e.env = r.strings(obj, "env");
  if (auto it = obj.find("deviceNodes"); it != obj.end() && it->is_array()) {
    for (const auto& n : *it) {
      r.only(
          n,
          {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"},
          "deviceNodes entry");
      CdiDeviceNode d;
      d.path = r.str(n, "path", true);
      d.host_path = r.str(n, "hostPath");
      d.type = r.str(n, "type");
      d.major = r.number<long>(n, "major");
      d.minor = r.number<long>(n, "minor");
      d.file_mode = r.number<unsigned>(n, "fileMode");
      d.permissions = r.str(n, "permissions");
      d.uid = r.number<unsigned>(n, "uid");
      d.gid = r.number<unsigned>(n, "gid");
      e.device_nodes.push_back(std::move(d));
    }
  }
  if (auto it = obj.find("mounts"); it != obj.end() && it->is_array()) {
    for (const auto& m : *it) {
      r.only(m, {"hostPath", "containerPath", "options", "type"}, "mounts entry");
      e.mounts.push_back({r.str(m, "hostPath", true), r.str(m, "containerPath", true),
                          r.strings(m, "options"), r.str(m, "type")});
    }
  }
  if (auto it = obj.find("hooks"); it != obj.end() && it->is_array()) {
    for (const auto& h : *it) {
      r.only(h, {"hookName", "path", "args", "env", "timeout"}, "hooks entry");
      e.hooks.push_back({r.str(h, "hookName", true), r.str(h, "path", true), r.strings(h, "args"),
                         r.strings(h, "env"), r.number<int>(h, "timeout")});
    }
  }
  return e;
}

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
                     s.empty() || s.find_first_of(":#{}[],&*!|>'\"%@`") != std::string::npos;
    if (ambiguous)
      out << YAML::DoubleQuoted << s;
    else
      out << s;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<long long>();
  } else {
    out << YAML::Null;
  }
}

bool valid_vendor(std::string_view v) {
  if (v.empty() || !std::isalpha(static_cast<unsigned char>(v.front())) ||
      !std::isalnum(static_cast<unsigned char>(v.back()))) {
    return false;
  }
  return std::all_of(v.begin(), v.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

bool valid_class(std::string_view c) {
  if (c.empty() || !std::isalpha(static_cast<unsigned char>(c.front())) ||
      !std::isalnum(static_cast<unsigned char>(c.back()))) {
    return false;
  }
  return std::all_of(c.begin(), c.end(),
                     [](unsigned char x) { return std::isalnum(x) || x == '-' || x == '_'; });
}

bool valid_device_name(std::string_view n) {
  if (n.empty() || !std::isalnum(static_cast<unsigned char>(n.front())) ||
      !std::isalnum(static_cast<unsigned char>(n.back()))) {
    return false;
  }
  return std::all_of(n.begin(), n.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == ':';
  });
}

int version_rank(std::string_view v) {
  auto it = std::find(kCdiVersions.begin(), kCdiVersions.end(), v);
  return it == kCdiVersions.end() ? -1 : static_cast<int>(it - kCdiVersions.begin());
}

Status validate_edits(const CdiContainerEdits& e, const std::string& where) {
  for (const auto& env : e.env) {
    if (env.find('=') == std::string::npos || env.front() == '=') {
      return fail(Errc::parse, where, ": env entry '", env, "' is not KEY=VALUE");
    }
  }
  for (const auto& d : e.device_nodes) {
    if (d.path.empty() || d.path.front() != '/')
      return fail(Errc::parse, where, ": deviceNodes path '", d.path, "' must be absolute");
    if (!d.host_path.empty() && d.host_path.front() != '/') {
      return fail(Errc::parse, where, ": deviceNodes hostPath '", d.host_path,
                  "' must be absolute");
    }
    if (!d.type.empty() && d.type != "c" && d.type != "b" && d.type != "u" && d.type != "p") {
      return fail(Errc::parse, where, ": deviceNodes type '", d.type, "' is not b, c, u or p");
    }
    if (d.permissions.find_first_not_of("rwm") != std::string::npos) {
      return fail(Errc::parse, where, ": deviceNodes permissions '", d.permissions,
                  "' may hold only r, w, m");
    }
  }
  for (const auto& m : e.mounts) {
    if (m.container_path.empty() || m.container_path.front() != '/') {
      return fail(Errc::parse, where, ": mount containerPath '", m.container_path,
                  "' must be absolute");
    }
    if (m.host_path.empty())
      return fail(Errc::parse, where, ": mount of ", m.container_path, " has no hostPath");
  }
  static const std::set<std::string, std::less<>> hook_names = {
      "prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"};
  for (const auto& h : e.hooks) {
    if (!hook_names.contains(h.hook_name))
      return fail(Errc::parse, where, ": unknown hookName '", h.hook_name, "'");
    if (h.path.empty() || h.path.front() != '/')
      return fail(Errc::parse, where, ": hook path '", h.path, "' must be absolute");
  }
  return {};
}

}  // namespace

Result<CdiSpec> parse_cdi_spec(std::string_view text, std::string_view origin) {
  Json doc;
  try {
    doc = yaml_to_json(YAML::Load(std::string(text)));
  } catch (const YAML::Exception& e) {
    return fail(Errc::parse, origin, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg);
  }
  Reader r{std::string(origin), {}};
  if (!doc.is_object()) return fail(Errc::parse, origin, ": not a CDI spec (expected a map)");
  r.only(doc, {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}, "spec");
  CdiSpec spec;
  spec.cdi_version = r.str(doc, "cdiVersion", true);
  spec.kind = r.str(doc, "kind", true);
  spec.annotations = r.string_map(doc, "annotations");
  if (auto it = doc.find("devices"); it != doc.end() && it->is_array()) {
    for (const auto& d : *it) {
      r.only(d, {"name", "annotations", "containerEdits"}, "device");
      CdiDevice dev;
      dev.name = r.str(d, "name", true);
      dev.annotations = r.string_map(d, "annotations");
      if (auto e = d.find("containerEdits"); e != d.end()) dev.edits = read_edits(r, *e);
      spec.devices.push_back(std::move(dev));
    }
  } else if (doc.contains("devices")) {
    r.fail_with("field 'devices' must be a list");
  }
  if (auto e = doc.find("containerEdits"); e != doc.end()) spec.edits = read_edits(r, *e);
  if (!r.error) return std::unexpected(r.error.error());
  if (auto st = validate_cdi_spec(spec); !st)
    return std::unexpected(st.error().wrap(std::string(origin)));
  return spec;
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

std::string minimum_cdi_version(const CdiSpec& spec) {
  int need = 0;  // 0.3.0
  auto edits = [&](const CdiContainerEdits& e) {
    for (const auto& m : e.mounts) {
      if (!m.type.empty()) need = std::max(need, version_rank("0.4.0"));
    }
    for (const auto& d : e.device_nodes) {
      if (!d.host_path.empty()) need = std::max(need, version_rank("0.5.0"));
    }
  };
  edits(spec.edits);
  for (const auto& d : spec.devices) {
    edits(d.edits);
    // Names starting with a digit ("0") need 0.5.0: measured, 0.4.0 left nvidia.com/gpu=0
    // unresolvable.
    if (!d.name.empty() && std::isdigit(static_cast<unsigned char>(d.name.front())))
      need = std::max(need, version_rank("0.5.0"));
    if (!d.annotations.empty()) need = std::max(need, version_rank("0.6.0"));
  }
  if (!spec.annotations.empty()) need = std::max(need, version_rank("0.6.0"));
  return kCdiVersions[static_cast<size_t>(need)];
}

Status validate_cdi_spec(const CdiSpec& spec) {
  int rank = version_rank(spec.cdi_version);
  if (rank < 0)
    return fail(Errc::parse, "cdiVersion '", spec.cdi_version,
                "' is not a CDI version (0.3.0 to 1.1.0)");
  std::string need = minimum_cdi_version(spec);
  if (rank < version_rank(need)) {
    return fail(Errc::parse, "cdiVersion ", spec.cdi_version,
                " is too old for what the spec uses (needs ", need, ")");
  }
  auto slash = spec.kind.find('/');
  if (slash == std::string::npos || !valid_vendor(std::string_view(spec.kind).substr(0, slash)) ||
      !valid_class(std::string_view(spec.kind).substr(slash + 1))) {
    return fail(Errc::parse, "kind '", spec.kind, "' is not vendor/class (e.g. nvidia.com/gpu)");
  }
  if (spec.devices.empty()) return fail(Errc::parse, "spec has no devices");
  std::set<std::string> names;
  for (const auto& d : spec.devices) {
    if (!valid_device_name(d.name))
      return fail(Errc::parse, "device name '", d.name, "' is invalid");
    if (!names.insert(d.name).second)
      return fail(Errc::parse, "device '", d.name, "' is defined twice");
    if (d.edits.empty()) return fail(Errc::parse, "device '", d.name, "' has no containerEdits");
    if (auto st = validate_edits(d.edits, "device " + d.name); !st) return st;
  }
  return validate_edits(spec.edits, "containerEdits");
}

}  // namespace gpufence
