// Small readers and writers over an OCI runtime spec (config.json) held as ordered JSON, so that
// every field we do not touch keeps its place.
#pragma once

#include <nlohmann/json.hpp>

#include "common/error.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace gpufence {

using Json = nlohmann::ordered_json;

std::optional<std::string> get_env(const Json& spec, std::string_view key);
// Sets KEY=value in process.env, replacing every existing KEY entry in place.
void set_env(Json& spec, std::string_view key, std::string_view value);

// The spec's node at a path of object keys, created (as objects/arrays) when absent.
Json& ensure_object(Json& parent, const char* key);
Json& ensure_array(Json& parent, const char* key);

}  // namespace gpufence

namespace gpufence {
// Checks the type of every field gpufence reads (process.env, capabilities, mounts, annotations,
// linux.devices, linux.resources.devices, hooks, root.path), so later steps can read them without
// a type check and a wrong type is reported by its path: "mounts[3].source must be a string".
Status check_spec_fields(const Json& spec);
}  // namespace gpufence
