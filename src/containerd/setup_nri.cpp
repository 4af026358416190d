// The NRI keys of install --enforcement nri|both (containerd/setup_parts.hpp).
#include "containerd/setup_parts.hpp"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include "common/file.hpp"
#include "common/go_match.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"
#include "containerd/toml_text.hpp"
#include "containerd/versions.hpp"

namespace gpufence::setup_parts {

// ---- NRI (install --enforcement nri|both) ----

std::vector<std::string> nri_key() {
  return {"plugins", std::string(kNriPlugin)};
}
std::vector<std::string> validator_key() {
  return {"plugins", std::string(kNriPlugin), "default_validator"};
}
// The file's own default_validator table, when it has one.
const toml::table* validator_table(const ContainerdConfig& cfg) {
  const toml::table* t = &cfg.doc;
  for (const auto& k : validator_key())
    if (!(t = t->get_as<toml::table>(k))) return nullptr;
  return t;
}

// The required plugins `base` already lists with ours added (a drop-in's array replaces the
// root file's, so the user's entries are carried into it).
toml::array required_plugins_with(const ContainerdConfig& base,
                                  const std::vector<std::string>& ours) {
  toml::array out;
  auto settings = nri_settings(base);
  for (const auto& p : settings.required_plugins) out.push_back(p);
  for (const auto& p : ours)
    if (std::find(settings.required_plugins.begin(), settings.required_plugins.end(), p) ==
        settings.required_plugins.end())
      out.push_back(p);
  return out;
}

constexpr std::string_view kTolerateKey = "tolerate_missing_plugins_annotation";

// Whether the earlier install's waiver key is to be taken out of `validator`.
bool drops_earlier_waiver(const toml::table* validator, const NriEdit& nri) {
  if (!validator || nri.earlier_tolerate_annotation.empty() ||
      nri.tolerate_annotation == nri.earlier_tolerate_annotation)
    return false;
  return validator->get_as<std::string>(kTolerateKey) &&
         validator->get_as<std::string>(kTolerateKey)->get() == nri.earlier_tolerate_annotation;
}

// Sets NRI's keys in `doc` (the whole file, or a drop-in).
void apply_nri(toml::table& doc, const ContainerdConfig& base, const NriEdit& nri) {
  toml::table& plugin = ensure_table(ensure_table(doc, "plugins"), kNriPlugin);
  plugin.insert_or_assign("disable", false);
  if (nri.required_plugins.empty()) return;
  toml::table& v = ensure_table(plugin, "default_validator");
  v.insert_or_assign("enable", true);
  v.insert_or_assign("required_plugins", required_plugins_with(base, nri.required_plugins));
  if (!nri.tolerate_annotation.empty())
    v.insert_or_assign(kTolerateKey, nri.tolerate_annotation);
  else if (drops_earlier_waiver(&v, nri))
    v.erase(kTolerateKey);
}

// The text with the one-line assignment of `key` directly in table `table` replaced by
// `key = value_toml` (its indent kept), or taken out when `value_toml` is nullopt; nullopt when
// there is no such line (a dotted key, an inline table). For what set_toml_key leaves alone (an
// array's value); the caller re-parses the result (if_equivalent) and re-serialises when a value
// ran over several lines.
std::optional<std::string> edit_toml_key_line(std::string_view text,
                                              const std::vector<std::string>& table,
                                              std::string_view key,
                                              std::optional<std::string_view> value_toml) {
  for (const auto& sec : toml_sections(text)) {
    if (sec.array_of_tables || sec.key != table) continue;
    size_t at = sec.body;
    while (at < sec.end) {
      size_t eol = text.find('\n', at);
      size_t next = eol == std::string_view::npos || eol + 1 > sec.end ? sec.end : eol + 1;
      std::string_view raw = text.substr(at, next - at);
      std::string_view line = trim(raw);
      if (line.starts_with(key) && trim(line.substr(key.size())).starts_with("=")) {
        if (!value_toml) return cat(text.substr(0, at), text.substr(next));
        std::string_view indent = raw.substr(0, raw.find_first_not_of(" \t"));
        return cat(text.substr(0, at), indent, key, " = ", *value_toml, "\n", text.substr(next));
      }
      at = next;
    }
  }
  return std::nullopt;
}

// The same as line edits of the user's text (nullopt where a line edit is not possible).
std::optional<std::string> apply_nri_text(std::optional<std::string> text,
                                          const ContainerdConfig& base, const NriEdit& nri) {
  if (!text) return text;
  text = set_toml_key(*text, nri_key(), "disable", "false");
  if (!text || nri.required_plugins.empty()) return text;
  std::string list;
  for (const auto& p : required_plugins_with(base, nri.required_plugins))
    list += (list.empty() ? "" : ", ") + toml_quote(*p.value<std::string>());
  text = set_toml_key(*text, validator_key(), "enable", "true");
  if (text) {
    // An array already there (an earlier install's): set_toml_key leaves arrays alone.
    const std::string value = "[" + list + "]";
    auto set = set_toml_key(*text, validator_key(), "required_plugins", value);
    text = set ? set : edit_toml_key_line(*text, validator_key(), "required_plugins", value);
  }
  if (text && !nri.tolerate_annotation.empty())
    text = set_toml_key(*text, validator_key(), kTolerateKey, toml_quote(nri.tolerate_annotation));
  else if (text && drops_earlier_waiver(validator_table(base), nri))
    text = edit_toml_key_line(*text, validator_key(), kTolerateKey, std::nullopt);
  return text;
}

// What the NRI edit must guarantee, checked on the re-parsed result: NRI stated on, our plugins
// required through an enabled validator, and an earlier install's waiver gone.
Status verify_nri(const std::string& text, const std::string& origin, const NriEdit& nri) {
  if (!nri.enable) return {};
  auto cfg = parse_containerd_config(text, origin);
  if (!cfg) return std::unexpected(cfg.error().wrap("result does not parse"));
  auto s = nri_settings(*cfg);
  if (!s.enabled || !s.explicitly_set)
    return fail(Errc::internal, origin, ": result does not set [plugins.\"", kNriPlugin,
                "\"] disable = false");
  for (const auto& p : nri.required_plugins)
    if (!s.validator_enabled || std::find(s.required_plugins.begin(), s.required_plugins.end(),
                                          p) == s.required_plugins.end())
      return fail(Errc::internal, origin, ": result lacks \"", p,
                  "\" in default_validator.required_plugins");
  if (!nri.earlier_tolerate_annotation.empty() &&
      nri.tolerate_annotation != nri.earlier_tolerate_annotation &&
      s.tolerate_annotation == nri.earlier_tolerate_annotation)
    return fail(Errc::internal, origin, ": result keeps tolerate_missing_plugins_annotation = \"",
                nri.earlier_tolerate_annotation, "\"");
  return {};
}

}  // namespace gpufence::setup_parts
