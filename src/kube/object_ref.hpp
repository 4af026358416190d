// "NAMESPACE/NAME" as the flags write an object of the API (--deployment, --lease,
// --streams-configmap NAMESPACE/NAME:KEY), parsed once. Both parts are checked as the API server
// validates them (k8s.io/apimachinery/pkg/util/validation: a namespace is a DNS-1123 label, an
// object name a DNS-1123 subdomain), so a part never carries '/', '?' or '..' into a request path.
#pragma once

#include <string>
#include <string_view>

#include "common/error.hpp"

namespace gpufence {

struct ObjectRef {
  std::string ns;
  std::string name;
  bool operator==(const ObjectRef&) const = default;
};

// `flag` names the option in errors ("--deployment wants NAMESPACE/NAME, got ...").
Result<ObjectRef> parse_object_ref(std::string_view text, std::string_view flag);

// "NAMESPACE/NAME:KEY" (a ConfigMap's key: [-._a-zA-Z0-9]+, IsConfigMapKey).
struct ObjectKeyRef {
  ObjectRef object;
  std::string key;
};
Result<ObjectKeyRef> parse_object_key_ref(std::string_view text, std::string_view flag);

}  // namespace gpufence
