#include "kube/object_ref.hpp"

#include "common/strings.hpp"

namespace gpufence {
namespace {

bool lower_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

// IsDNS1123Label: at most 63 of [a-z0-9-], starting and ending alphanumeric.
bool dns1123_label(std::string_view s) {
  if (s.empty() || s.size() > 63 || !lower_alnum(s.front()) || !lower_alnum(s.back())) return false;
  for (char c : s)
    if (!lower_alnum(c) && c != '-') return false;
  return true;
}

// IsDNS1123Subdomain: at most 253, dot-separated labels.
bool dns1123_subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (std::string_view label : split(s, '.'))
    if (!dns1123_label(label)) return false;
  return true;
}

// IsConfigMapKey: at most 253 of [-._a-zA-Z0-9], not "." or "..".
bool config_map_key(std::string_view s) {
  if (s.empty() || s.size() > 253 || s == "." || s == "..") return false;
  for (char c : s)
    if (!lower_alnum(c) && !(c >= 'A' && c <= 'Z') && c != '-' && c != '.' && c != '_')
      return false;
  return true;
}

}  // namespace

Result<ObjectRef> parse_object_ref(std::string_view text, std::string_view flag) {
  auto slash = text.find('/');
  if (slash == std::string_view::npos)
    return fail(Errc::invalid_argument, flag, " wants NAMESPACE/NAME, got '", std::string(text),
                "'");
  ObjectRef ref{std::string(text.substr(0, slash)), std::string(text.substr(slash + 1))};
  if (!dns1123_label(ref.ns))
    return fail(Errc::invalid_argument, flag, " wants NAMESPACE/NAME: '", ref.ns,
                "' is not a namespace (lowercase letters, digits and '-', at most 63)");
  if (!dns1123_subdomain(ref.name))
    return fail(Errc::invalid_argument, flag, " wants NAMESPACE/NAME: '", ref.name,
                "' is not an object name (lowercase letters, digits, '-' and '.', at most 253)");
  return ref;
}

Result<ObjectKeyRef> parse_object_key_ref(std::string_view text, std::string_view flag) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos)
    return fail(Errc::invalid_argument, flag, " wants NAMESPACE/NAME:KEY, got '", std::string(text),
                "'");
  auto object = parse_object_ref(text.substr(0, colon), flag);
  if (!object) return std::unexpected(object.error());
  std::string key(text.substr(colon + 1));
  if (!config_map_key(key))
    return fail(Errc::invalid_argument, flag, " wants NAMESPACE/NAME:KEY: '", key,
                "' is not a ConfigMap key");
  return ObjectKeyRef{std::move(*object), std::move(key)};
}

}  // namespace gpufence
