#include "runtime/oci_spec.hpp"

#include <functional>

#include "common/strings.hpp"

namespace gpufence {

std::optional<std::string> get_env(const Json& spec, std::string_view key) {
  auto proc = spec.find("process");
  if (proc == spec.end() || !proc->is_object()) return std::nullopt;
  auto env = proc->find("env");
  if (env == proc->end() || !env->is_array()) return std::nullopt;
  std::optional<std::string> found;
  for (const auto& e : *env) {  // the last assignment wins, as execve's environment does
    if (!e.is_string()) continue;
    const auto& s = e.get_ref<const std::string&>();
    if (s.size() > key.size() && s.compare(0, key.size(), key) == 0 && s[key.size()] == '=') {
      found = s.substr(key.size() + 1);
    }
  }
  return found;
}

Json& ensure_object(Json& parent, const char* key) {
  Json& node = parent[key];
  if (!node.is_object()) node = Json::object();
  return node;
}

Json& ensure_array(Json& parent, const char* key) {
  Json& node = parent[key];
  if (!node.is_array()) node = Json::array();
  return node;
}

void set_env(Json& spec, std::string_view key, std::string_view value) {
  Json& env = ensure_array(ensure_object(spec, "process"), "env");
  std::string entry = std::string(key) + "=" + std::string(value);
  bool replaced = false;
  Json out = Json::array();
  for (auto& e : env) {
    if (e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      if (s.size() > key.size() && s.compare(0, key.size(), key) == 0 && s[key.size()] == '=') {
        if (!replaced) out.push_back(entry);
        replaced = true;
        continue;
      }
    }
    out.push_back(std::move(e));
  }
  if (!replaced) out.push_back(entry);
  env = std::move(out);
}

}  // namespace gpufence

namespace gpufence {
namespace {

using Check = Status;

Check expect_type(const Json& node, Json::value_t type, std::string_view where,
                  std::string_view what) {
  bool ok =
      node.type() == type || (type == Json::value_t::number_integer && node.is_number_unsigned());
  if (!ok) return fail(Errc::parse, where, " must be ", what);
  return {};
}

// Optional member `key` of `obj` of the given type. Absent is fine; null is not (the readers take
// a missing member's default, and OCI producers omit, never null, these scalars): found by the
// fuzzer, `"type": null` passed and then threw where the member was read.
Check optional_member(const Json& obj, const char* key, Json::value_t type, std::string_view where,
                      std::string_view what) {
  auto it = obj.find(key);
  if (it == obj.end()) return {};
  return expect_type(*it, type, cat(where, ".", key), what);
}

Check string_array(const Json& obj, const char* key, std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return {};
  std::string path = cat(where, where.empty() ? "" : ".", key);
  if (!it->is_array()) return fail(Errc::parse, path, " must be an array of strings");
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string()) return fail(Errc::parse, path, "[", i, "] must be a string");
  }
  return {};
}

Check object_array(const Json& obj, const char* key, std::string_view where,
                   const std::function<Check(const Json&, const std::string&)>& each) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return {};
  std::string path = cat(where, where.empty() ? "" : ".", key);
  if (!it->is_array()) return fail(Errc::parse, path, " must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    std::string item = cat(path, "[", i, "]");
    if (!(*it)[i].is_object()) return fail(Errc::parse, item, " must be an object");
    if (auto st = each((*it)[i], item); !st) return st;
  }
  return {};
}

Check check_mount(const Json& m, const std::string& where) {
  for (const char* key : {"destination", "source", "type"}) {
    if (auto st = optional_member(m, key, Json::value_t::string, where, "a string"); !st) return st;
  }
  return string_array(m, "options", where);
}

Check check_device(const Json& d, const std::string& where) {
  auto path = d.find("path");
  if (path == d.end() || !path->is_string())
    return fail(Errc::parse, where, ".path must be a string");
  if (auto st = optional_member(d, "type", Json::value_t::string, where, "a string"); !st)
    return st;
  // A device's numbers are plain integers in the OCI schema (containerd never writes null; only
  // a device cgroup rule's may be null, meaning "all"): null here is refused, not read as 0.
  for (const char* key : {"major", "minor"}) {
    auto it = d.find(key);
    if (it == d.end()) continue;
    if (!it->is_number_integer() || it->get<long long>() < 0 || it->get<long long>() > 0xFFFFFFFFLL)
      return fail(Errc::parse, where, ".", key, " must be a non-negative integer");
  }
  return {};
}

Check check_hook(const Json& h, const std::string& where) {
  auto path = h.find("path");
  if (path == h.end() || !path->is_string())
    return fail(Errc::parse, where, ".path must be a string");
  if (auto st = string_array(h, "args", where); !st) return st;
  if (auto st = string_array(h, "env", where); !st) return st;
  return optional_member(h, "timeout", Json::value_t::number_integer, where, "an integer");
}

}  // namespace

Status check_spec_fields(const Json& spec) {
  if (!spec.is_object()) return fail(Errc::parse, "the spec must be a JSON object");
  if (auto st = optional_member(spec, "root", Json::value_t::object, "", "an object"); !st)
    return st;
  if (auto root = spec.find("root"); root != spec.end() && root->is_object()) {
    if (auto st = optional_member(*root, "path", Json::value_t::string, "root", "a string"); !st)
      return st;
  }
  if (auto st = optional_member(spec, "process", Json::value_t::object, "", "an object"); !st)
    return st;
  if (auto proc = spec.find("process"); proc != spec.end() && proc->is_object()) {
    if (auto st = string_array(*proc, "env", "process"); !st) return st;
    if (auto st =
            optional_member(*proc, "capabilities", Json::value_t::object, "process", "an object");
        !st)
      return st;
    if (auto caps = proc->find("capabilities"); caps != proc->end() && caps->is_object()) {
      if (auto st = string_array(*caps, "bounding", "process.capabilities"); !st) return st;
    }
  }
  if (auto st = object_array(spec, "mounts", "", check_mount); !st) return st;
  if (auto ann = spec.find("annotations"); ann != spec.end() && !ann->is_null()) {
    if (!ann->is_object()) return fail(Errc::parse, "annotations must be an object");
    for (const auto& [key, value] : ann->items()) {
      if (!value.is_string()) return fail(Errc::parse, "annotations.", key, " must be a string");
    }
  }
  if (auto st = optional_member(spec, "linux", Json::value_t::object, "", "an object"); !st)
    return st;
  if (auto lin = spec.find("linux"); lin != spec.end() && lin->is_object()) {
    if (auto st = object_array(*lin, "devices", "linux", check_device); !st) return st;
    if (auto st = optional_member(*lin, "resources", Json::value_t::object, "linux", "an object");
        !st)
      return st;
  }
  if (auto st = optional_member(spec, "hooks", Json::value_t::object, "", "an object"); !st)
    return st;
  if (auto hooks = spec.find("hooks"); hooks != spec.end() && hooks->is_object()) {
    for (const auto& [name, list] : hooks->items()) {
      if (auto st = object_array(*hooks, name.c_str(), "hooks", check_hook); !st) return st;
    }
  }
  return {};
}

}  // namespace gpufence
