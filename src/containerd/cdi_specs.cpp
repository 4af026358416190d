#include "containerd/cdi_specs.hpp"

#include "cdi/spec.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

// The kind of a spec that does not parse: the value after the first `kind` key, JSON or YAML.
std::string sniff_kind(std::string_view text) {
  for (std::string_view key : {std::string_view("\"kind\""), std::string_view("kind")}) {
    size_t at = 0;
    while ((at = text.find(key, at)) != std::string_view::npos) {
      size_t i = at + key.size();
      while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
      if (i < text.size() && text[i] == ':') {
        ++i;
        while (i < text.size() &&
               (text[i] == ' ' || text[i] == '\t' || text[i] == '"' || text[i] == '\''))
          ++i;
        size_t e = i;
        while (e < text.size() && text[e] != '"' && text[e] != '\'' && text[e] != ',' &&
               text[e] != '\n' && text[e] != '}' && text[e] != ' ')
          ++e;
        return std::string(text.substr(i, e - i));
      }
      at = i;
    }
  }
  return "";
}

}  // namespace

std::vector<CdiSpecFile> read_cdi_spec_dirs(const HostFs& host,
                                            const std::vector<std::string>& dirs) {
  std::vector<CdiSpecFile> out;
  for (const auto& dir : dirs) {
    auto names = host.list(dir);
    if (!names) continue;
    for (const auto& name : *names) {
      if (!name.ends_with(".json") && !name.ends_with(".yaml") && !name.ends_with(".yml")) continue;
      CdiSpecFile f;
      f.path = dir + (dir.ends_with("/") ? "" : "/") + name;
      auto text = host.read(f.path);
      if (!text) {
        f.error = text.error().message;
        out.push_back(std::move(f));
        continue;
      }
      auto spec = parse_cdi_spec(*text, f.path);
      if (spec) {
        f.kind = spec->kind;
        for (const auto& d : spec->devices) f.devices.push_back(d.name);
      } else {
        f.kind = sniff_kind(*text);
        f.error = spec.error().message;
      }
      out.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace gpufence
