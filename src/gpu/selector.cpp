#include "gpu/selector.hpp"

#include <algorithm>
#include <cctype>

#include "common/escape.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

bool all_digits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

bool is_uuid_body(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](unsigned char c) { return std::isxdigit(c) || c == '-'; });
}

// "<gpu>:<mig>" as nvidia-container-runtime reads MIG devices by index.
bool is_mig_index(std::string_view s) {
  auto colon = s.find(':');
  return colon != std::string_view::npos && all_digits(s.substr(0, colon)) &&
         all_digits(s.substr(colon + 1));
}

}  // namespace

Result<DeviceToken> parse_device_token(std::string_view raw) {
  std::string_view token = trim(raw);
  if (token.empty()) return fail(Errc::invalid_argument, "empty device id");
  if (token.size() > kMaxDeviceTokenLength) {
    return fail(Errc::invalid_argument, "device id '", token.substr(0, 24), "...' is ",
                token.size(), " characters long (at most ", kMaxDeviceTokenLength, ")");
  }
  DeviceToken out;
  out.text = std::string(token);

  std::string_view body = token;
  if (token == "all") {
    out.kind = DeviceToken::Kind::all;
    return out;
  }
  if (auto cdi = split_cdi_name(token)) {
    if (!is_gpu_cdi_kind(cdi->kind)) {
      return fail(Errc::invalid_argument, "device '", token, "': CDI kind '", cdi->kind,
                  "' is not ", kCdiKind, " or ", kNvidiaCdiKind);
    }
    out.cdi_kind = std::string(cdi->kind);
    body = cdi->name;
    if (body.empty())
      return fail(Errc::invalid_argument, "device '", token, "': empty CDI device name");
    if (body == "all") {
      out.kind = DeviceToken::Kind::all;
      return out;
    }
  }

  if (starts_with_ci(body, "MIG-") || is_mig_index(body)) {
    return fail(Errc::unsupported, "device '", token, "': MIG is not supported yet");
  }
  if (all_digits(body)) {
    auto index = parse_number<unsigned>(body);
    if (!index) return fail(Errc::invalid_argument, "device '", token, "': index out of range");
    out.kind = DeviceToken::Kind::index;
    out.index = *index;
    return out;
  }
  if (starts_with_ci(body, "GPU-")) {
    std::string_view rest = body.substr(4);
    if (rest.empty())
      return fail(Errc::invalid_argument, "device '", token, "': UUID is empty after 'GPU-'");
    if (!is_uuid_body(rest)) {
      return fail(Errc::invalid_argument, "device '", token,
                  "': UUID may hold only hex digits and '-'");
    }
    out.kind = DeviceToken::Kind::uuid;
    out.uuid = "GPU-" + to_lower(rest);
    return out;
  }
  return fail(Errc::invalid_argument, "device '", token,
              "' is not an index, a GPU-<uuid>, a CDI name or 'all'");
}

Result<DeviceSelector> parse_device_selector(std::string_view raw) {
  std::string_view value = trim(raw);
  DeviceSelector out;
  if (value.empty() || value == "void") return out;  // Kind::unset
  if (value == "none") {
    out.kind = DeviceSelector::Kind::none;
    return out;
  }
  if (value == "all") {
    out.kind = DeviceSelector::Kind::all;
    return out;
  }
  if (value == kMountMarkerRoot || value == std::string(kMountMarkerRoot) + "/") {
    out.kind = DeviceSelector::Kind::volume_mounts;
    return out;
  }
  out.kind = DeviceSelector::Kind::list;
  for (std::string_view part : split(value, ',')) {
    if (trim(part).empty()) {
      return fail(Errc::invalid_argument, "device list '", escape_excerpt(value),
                  "' has an empty entry");
    }
    auto token = parse_device_token(part);
    if (!token) return std::unexpected(token.error());
    if (token->kind == DeviceToken::Kind::all && value.find(',') != std::string_view::npos) {
      return fail(Errc::invalid_argument, "device list '", escape_excerpt(value),
                  "': 'all' cannot be combined with other devices");
    }
    out.tokens.push_back(std::move(*token));
  }
  return out;
}

Result<std::vector<Gpu>> resolve_token(const DeviceToken& token,
                                       const std::vector<Gpu>& inventory) {
  switch (token.kind) {
    case DeviceToken::Kind::all:
      return inventory;
    case DeviceToken::Kind::index:
      for (const auto& gpu : inventory) {
        if (gpu.index == token.index) return std::vector<Gpu>{gpu};
      }
      return fail(Errc::not_found, "device '", token.text, "': no GPU with index ", token.index,
                  " (this node has ", inventory.size(), ")");
    case DeviceToken::Kind::uuid: {
      const Gpu* match = nullptr;
      const std::string wanted = to_lower(token.uuid);
      for (const auto& gpu : inventory) {
        std::string uuid = to_lower(gpu.uuid);
        if (uuid == wanted) return std::vector<Gpu>{gpu};
        if (uuid.starts_with(wanted)) {
          if (match) {
            return fail(Errc::invalid_argument, "device '", token.text,
                        "': UUID prefix is ambiguous (matches ", match->uuid, " and ", gpu.uuid,
                        ")");
          }
          match = &gpu;
        }
      }
      if (!match) return fail(Errc::not_found, "device '", token.text, "': no GPU with this UUID");
      return std::vector<Gpu>{*match};
    }
  }
  return fail(Errc::internal, "unhandled device token kind");
}

Result<std::vector<Gpu>> resolve_selector(const DeviceSelector& selector,
                                          const std::vector<Gpu>& inventory) {
  switch (selector.kind) {
    case DeviceSelector::Kind::unset:
    case DeviceSelector::Kind::none:
    case DeviceSelector::Kind::volume_mounts:
      return std::vector<Gpu>{};
    case DeviceSelector::Kind::all:
      return inventory;
    case DeviceSelector::Kind::list:
      break;
  }
  std::vector<Gpu> out;
  for (const auto& token : selector.tokens) {
    auto gpus = resolve_token(token, inventory);
    if (!gpus) return std::unexpected(gpus.error());
    for (auto& gpu : *gpus) {
      bool seen =
          std::any_of(out.begin(), out.end(), [&](const Gpu& g) { return g.uuid == gpu.uuid; });
      if (seen) {
        return fail(Errc::invalid_argument, "device '", token.text, "': ", gpu.uuid,
                    " is named more than once");
      }
      out.push_back(std::move(gpu));
    }
  }
  return out;
}

}  // namespace gpufence
