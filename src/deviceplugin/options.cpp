#include "deviceplugin/options.hpp"

#include "common/strings.hpp"

namespace gpufence {

Result<std::set<ListStrategy>> parse_list_strategies(std::string_view text) {
  std::set<ListStrategy> out;
  for (std::string_view part : split(text, ',')) {
    part = trim(part);
    if (part == "device-specs")
      out.insert(ListStrategy::device_specs);
    else if (part == "volume-mounts")
      out.insert(ListStrategy::volume_mounts);
    else if (part == "cdi-annotations")
      out.insert(ListStrategy::cdi_annotations);
    else if (part == "cdi-cri")
      out.insert(ListStrategy::cdi_cri);
    else if (part == "envvar")
      out.insert(ListStrategy::envvar);
    else {
      return fail(Errc::invalid_argument, "unknown device list strategy '", part,
                  "' (device-specs, volume-mounts, cdi-annotations, cdi-cri, envvar)");
    }
  }
  return out;
}

Result<DeviceIdStrategy> parse_id_strategy(std::string_view text) {
  if (text == "uuid") return DeviceIdStrategy::uuid;
  if (text == "index") return DeviceIdStrategy::index;
  return fail(Errc::invalid_argument, "unknown device id strategy '", text, "' (uuid or index)");
}

Result<std::set<std::uint64_t>> parse_xid_list(std::string_view text) {
  std::set<std::uint64_t> out;
  if (trim(text).empty()) return out;
  for (std::string_view part : split(text, ',')) {
    auto xid = parse_number<std::uint64_t>(trim(part));
    if (!xid) return fail(Errc::invalid_argument, "XID '", trim(part), "' is not a number");
    out.insert(*xid);
  }
  return out;
}

Result<std::optional<std::chrono::milliseconds>> parse_duration(std::string_view text) {
  text = trim(text);
  if (text.empty() || text == "0" || text == "off")
    return std::optional<std::chrono::milliseconds>{};
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  auto value = parse_number<std::uint64_t>(text.substr(0, digits));
  std::string_view unit = text.substr(digits);
  if (unit.empty()) unit = "s";  // a bare number is seconds
  if (!value)
    return fail(Errc::invalid_argument, "duration '", text, "' must be like 30s, 5m or 1500ms");
  std::uint64_t ms = 0;
  if (unit == "ms")
    ms = *value;
  else if (unit == "s")
    ms = *value * 1000;
  else if (unit == "m")
    ms = *value * 60'000;
  else if (unit == "h")
    ms = *value * 3'600'000;
  else
    return fail(Errc::invalid_argument, "duration '", text, "' needs a unit: ms, s, m or h");
  if (ms == 0) return std::optional<std::chrono::milliseconds>{};
  return std::optional<std::chrono::milliseconds>{std::chrono::milliseconds(ms)};
}

}  // namespace gpufence
