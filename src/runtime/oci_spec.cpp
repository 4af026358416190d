#include "runtime/oci_spec.hpp"

namespace gpufence {

bool is_privileged(const Json& spec) {
  auto proc = spec.find("process");
  if (proc == spec.end() || !proc->is_object()) return false;
  auto caps = proc->find("capabilities");
  if (caps == proc->end() || !caps->is_object()) return false;
  auto bounding = caps->find("bounding");
  if (bounding == caps->end() || !bounding->is_array()) return false;
  for (const auto& cap : *bounding) {
    if (cap.is_string() && cap.get_ref<const std::string&>() == "CAP_SYS_ADMIN") return true;
  }
  return false;
}

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
