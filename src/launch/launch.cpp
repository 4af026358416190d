#include "launch/launch.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <optional>

#include "common/strings.hpp"
#include "gpu/selector.hpp"
#include "runtime/isolation.hpp"

namespace gpufence {
namespace {

// A UUID list ("GPU-a,GPU-b"), or nullopt when the value is anything else (all, indices, ...).
std::optional<std::vector<std::string>> uuid_list(const std::string& value) {
  auto sel = parse_device_selector(value);
  if (!sel || sel->kind != DeviceSelector::Kind::list) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& t : sel->tokens) {
    if (t.kind != DeviceToken::Kind::uuid) return std::nullopt;
    out.emplace_back(t.id());
  }
  return out;
}

struct AllocationSource {
  std::string name;  // "CUDA_VISIBLE_DEVICES", ...
  std::vector<std::string> uuids;
};

// CUDA accepts a unique prefix of a UUID (CUDA programming guide, "CUDA Environment Variables"),
// so "GPU-5a1c" and the full UUID are the same GPU.
bool same_gpu(std::string_view a, std::string_view b) {
  return a.starts_with(b) || b.starts_with(a);
}

// Same GPUs, in any order (each named once).
bool same_gpus(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.size() != b.size()) return false;
  std::vector<bool> used(b.size(), false);
  for (const auto& x : a) {
    bool found = false;
    for (size_t i = 0; i < b.size() && !found; ++i) {
      if (!used[i] && same_gpu(x, b[i])) used[i] = found = true;
    }
    if (!found) return false;
  }
  return true;
}

std::vector<AllocationSource> allocation_sources(const std::map<std::string, std::string>& env,
                                                 const std::vector<std::string>& marker_names) {
  std::vector<AllocationSource> out;
  for (const char* key : {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}) {
    if (auto it = env.find(key); it != env.end()) {
      if (auto uuids = uuid_list(it->second)) out.push_back({key, *uuids});
    }
  }
  AllocationSource markers{std::string(kMountMarkerRoot), {}};
  for (const auto& name : marker_names) {
    if (name.starts_with("GPU-")) markers.uuids.push_back(name);
  }
  std::sort(markers.uuids.begin(), markers.uuids.end());  // a directory listing has no order
  if (!markers.uuids.empty()) out.push_back(std::move(markers));
  return out;
}

// A gpu-id value, as the allocation numbers it.
Result<long> target_gpu_id(std::string_view value, size_t allocated, std::string_view where) {
  auto id = parse_number<long>(value);
  if (!id) return fail(Errc::parse, where, ": gpu-id '", value, "' is not a number");
  long target = allocated == 1 ? 0 : *id;
  if (target < 0 || static_cast<size_t>(target) >= allocated) {
    return fail(Errc::invalid_argument, where, ": gpu-id=", *id,
                " but the container was allocated ", allocated,
                " GPU(s) (gpu-id counts them from 0)");
  }
  return target;
}

// "  key = value  # note" -> the key, and where the value starts and ends in the line. GLib key
// files only know whole-line comments, but g_key_file_get_integer stops at the first space, so
// DeepStream configs carry trailing "# ..." notes after numbers; they are not part of the value.
struct KeyValue {
  std::string_view key;
  size_t value_begin = 0, value_end = 0;
};

std::optional<KeyValue> key_value(std::string_view line) {
  size_t first = line.find_first_not_of(" \t");
  if (first == std::string_view::npos || line[first] == '#' || line[first] == '[')
    return std::nullopt;
  size_t eq = line.find('=', first);
  if (eq == std::string_view::npos) return std::nullopt;
  KeyValue kv;
  kv.key = trim(line.substr(first, eq - first));
  std::string_view rest = line.substr(eq + 1);
  if (auto hash = rest.find('#'); hash != std::string_view::npos) rest = rest.substr(0, hash);
  std::string_view value = trim(rest);
  kv.value_begin = value.empty() ? eq + 1 : static_cast<size_t>(value.data() - line.data());
  kv.value_end = kv.value_begin + value.size();
  return kv;
}

// One in-place edit of a YAML document: replace [pos, pos + length) with `text`.
struct Edit {
  size_t pos = 0, length = 0;
  std::string text;
};

std::string apply_edits(std::string_view text, std::vector<Edit> edits) {
  std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.pos > b.pos; });
  std::string out(text);
  for (const auto& e : edits) out.replace(e.pos, e.length, e.text);
  return out;
}

// Where a scalar's value lies in the source: yaml-cpp gives the node's start (the opening quote
// of a quoted scalar). Only single-line plain or quoted scalars are edited; anything else (block
// scalars, escapes) is refused rather than rewritten at a guessed offset.
Result<Edit> scalar_span(std::string_view text, const YAML::Node& node, std::string_view origin) {
  const YAML::Mark mark = node.Mark();
  std::string value = node.Scalar();
  auto where = cat(origin, ":", mark.line + 1);
  if (mark.pos < 0 || static_cast<size_t>(mark.pos) >= text.size())
    return fail(Errc::parse, where, ": cannot locate the value in the text");
  size_t pos = static_cast<size_t>(mark.pos);
  if (text.substr(pos, value.size()) == value) return Edit{pos, value.size(), {}};
  char quote = text[pos];
  if ((quote == '"' || quote == '\'') && text.substr(pos + 1, value.size()) == value &&
      pos + 1 + value.size() < text.size() && text[pos + 1 + value.size()] == quote)
    return Edit{pos + 1, value.size(), {}};
  return fail(Errc::parse, where, ": '", value,
              "' is not written as a plain or simply quoted value; rewrite it by hand");
}

bool is_config_ref_key(std::string_view key) {
  // deepstream-app's YAML groups use config-file; the test apps' YAML use config-file-path.
  return key == "config-file" || key == "config-file-path";
}

// Visits every (key, value) pair of every mapping in the document.
template <class F>
Status visit_pairs(const YAML::Node& node, F&& f) {
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (it->first.IsScalar()) {
        if (auto st = f(it->first.Scalar(), it->second); !st) return st;
      }
      if (auto st = visit_pairs(it->second, f); !st) return st;
    }
  } else if (node.IsSequence()) {
    for (const auto& child : node) {
      if (auto st = visit_pairs(child, f); !st) return st;
    }
  }
  return {};
}

Result<YAML::Node> load_yaml(std::string_view config, std::string_view origin) {
  try {
    return YAML::Load(std::string(config));
  } catch (const YAML::Exception& e) {
    return fail(Errc::parse, origin, ": ", e.what());
  }
}

}  // namespace

Result<std::vector<std::string>> allocated_uuids(const std::map<std::string, std::string>& env,
                                                 const std::vector<std::string>& marker_names) {
  auto sources = allocation_sources(env, marker_names);
  if (sources.empty()) {
    return fail(Errc::not_found,
                "no allocated GPU found: expected GPU UUIDs in CUDA_VISIBLE_DEVICES or "
                "NVIDIA_VISIBLE_DEVICES, or mount markers in ",
                kMountMarkerRoot, " (does the pod request nvidia.com/gpu?)");
  }
  for (size_t i = 1; i < sources.size(); ++i) {
    if (!same_gpus(sources.front().uuids, sources[i].uuids)) {
      return fail(Errc::denied, "the allocation's sources disagree: ", sources.front().name, " = ",
                  join(sources.front().uuids, ","), " but ", sources[i].name, " = ",
                  join(sources[i].uuids, ","),
                  "; refusing to guess which GPUs are this container's (unset the stale one)");
    }
  }
  // CUDA_VISIBLE_DEVICES first: its order is the order CUDA enumerates.
  return sources.front().uuids;
}

size_t openable_gpu_count(const HostFs& host) {
  size_t count = 0;
  auto names = host.list("/dev");
  if (!names) return 0;
  for (const auto& n : *names) {
    if (!gpu_node_minor("/dev/" + n)) continue;
    int fd = ::open(host.resolve("/dev/" + n).c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0 || errno == ENXIO) ++count;
    if (fd >= 0) ::close(fd);
  }
  return count;
}

ConfigFormat config_format(std::string_view path) {
  return path.ends_with(".yml") || path.ends_with(".yaml") ? ConfigFormat::yaml
                                                           : ConfigFormat::key_file;
}

Result<Rewrite> rewrite_gpu_ids(std::string_view config, size_t allocated,
                                std::string_view origin) {
  Rewrite out;
  std::vector<std::string_view> lines = split(config, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    std::string changed_line;
    if (auto kv = key_value(line)) {
      std::string_view value = line.substr(kv->value_begin, kv->value_end - kv->value_begin);
      if (kv->key == "gpu-id") {
        auto target = target_gpu_id(value, allocated, cat(origin, ":", i + 1));
        if (!target) return std::unexpected(target.error());
        if (std::to_string(*target) != value) {
          ++out.changed;
          changed_line = cat(line.substr(0, kv->value_begin), *target, line.substr(kv->value_end));
        }
      } else if (is_config_ref_key(kv->key)) {
        out.referenced.emplace_back(value);
      }
    }
    out.text += changed_line.empty() ? std::string(line) : changed_line;
    if (i + 1 < lines.size()) out.text += '\n';
  }
  return out;
}

Result<Rewrite> rewrite_gpu_ids_yaml(std::string_view config, size_t allocated,
                                     std::string_view origin) {
  auto doc = load_yaml(config, origin);
  if (!doc) return std::unexpected(doc.error());
  Rewrite out;
  std::vector<Edit> edits;
  auto st = visit_pairs(*doc, [&](const std::string& key, const YAML::Node& value) -> Status {
    if (key != "gpu-id" && !is_config_ref_key(key)) return {};
    auto where = cat(origin, ":", value.Mark().line + 1);
    if (!value.IsScalar()) return fail(Errc::parse, where, ": ", key, " is not a single value");
    if (is_config_ref_key(key)) {
      out.referenced.push_back(value.Scalar());
      return {};
    }
    auto target = target_gpu_id(value.Scalar(), allocated, where);
    if (!target) return std::unexpected(target.error());
    if (std::to_string(*target) == value.Scalar()) return {};
    auto span = scalar_span(config, value, origin);
    if (!span) return std::unexpected(span.error());
    span->text = std::to_string(*target);
    edits.push_back(*span);
    ++out.changed;
    return {};
  });
  if (!st) return std::unexpected(st.error());
  out.text = apply_edits(config, std::move(edits));
  return out;
}

Result<Rewrite> rewrite_gpu_ids(ConfigFormat format, std::string_view config, size_t allocated,
                                std::string_view origin) {
  return format == ConfigFormat::yaml ? rewrite_gpu_ids_yaml(config, allocated, origin)
                                      : rewrite_gpu_ids(config, allocated, origin);
}

std::string rename_config_refs(std::string_view config,
                               const std::map<std::string, std::string>& renames) {
  std::string out;
  std::vector<std::string_view> lines = split(config, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    auto kv = key_value(line);
    auto it = kv && is_config_ref_key(kv->key)
                  ? renames.find(
                        std::string(line.substr(kv->value_begin, kv->value_end - kv->value_begin)))
                  : renames.end();
    if (it != renames.end())
      out += cat(line.substr(0, kv->value_begin), it->second, line.substr(kv->value_end));
    else
      out += line;
    if (i + 1 < lines.size()) out += '\n';
  }
  return out;
}

Result<std::string> rename_config_refs_yaml(std::string_view config,
                                            const std::map<std::string, std::string>& renames,
                                            std::string_view origin) {
  auto doc = load_yaml(config, origin);
  if (!doc) return std::unexpected(doc.error());
  std::vector<Edit> edits;
  auto st = visit_pairs(*doc, [&](const std::string& key, const YAML::Node& value) -> Status {
    if (!is_config_ref_key(key) || !value.IsScalar()) return {};
    auto it = renames.find(value.Scalar());
    if (it == renames.end()) return {};
    auto span = scalar_span(config, value, origin);
    if (!span) return std::unexpected(span.error());
    span->text = it->second;
    edits.push_back(*span);
    return {};
  });
  if (!st) return std::unexpected(st.error());
  return apply_edits(config, std::move(edits));
}

Result<std::string> rename_config_refs(ConfigFormat format, std::string_view config,
                                       const std::map<std::string, std::string>& renames,
                                       std::string_view origin) {
  if (format == ConfigFormat::yaml) return rename_config_refs_yaml(config, renames, origin);
  return rename_config_refs(config, renames);
}

}  // namespace gpufence
