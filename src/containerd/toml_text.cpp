#include "containerd/toml_text.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

bool bare_key_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool blank(char c) {
  return c == ' ' || c == '\t';
}

// Parses one key (dotted) from text[i...], stopping at `stop` (']' for headers, '=' for
// assignments) outside quotes. Sets i at the stop character.
std::optional<std::vector<std::string>> parse_key_at(std::string_view t, size_t& i, char stop) {
  std::vector<std::string> parts;
  while (true) {
    while (i < t.size() && blank(t[i])) ++i;
    if (i >= t.size()) return std::nullopt;
    std::string part;
    if (t[i] == '"') {
      ++i;
      while (i < t.size() && t[i] != '"') {
        if (t[i] == '\\' && i + 1 < t.size()) {
          ++i;
          switch (t[i]) {
            case 'n':
              part += '\n';
              break;
            case 't':
              part += '\t';
              break;
            case '"':
              part += '"';
              break;
            case '\\':
              part += '\\';
              break;
            default:
              return std::nullopt;  // \u escapes: not in keys we edit
          }
        } else if (t[i] == '\n') {
          return std::nullopt;
        } else {
          part += t[i];
        }
        ++i;
      }
      if (i >= t.size()) return std::nullopt;
      ++i;
    } else if (t[i] == '\'') {
      ++i;
      while (i < t.size() && t[i] != '\'' && t[i] != '\n') part += t[i++];
      if (i >= t.size() || t[i] != '\'') return std::nullopt;
      ++i;
    } else {
      while (i < t.size() && bare_key_char(t[i])) part += t[i++];
      if (part.empty()) return std::nullopt;
    }
    parts.push_back(std::move(part));
    while (i < t.size() && blank(t[i])) ++i;
    if (i >= t.size()) return std::nullopt;
    if (t[i] == '.') {
      ++i;
      continue;
    }
    if (t[i] == stop) return parts;
    return std::nullopt;
  }
}

struct Line {
  size_t begin, end;  // end: after the newline (or the text's end)
};

std::vector<Line> lines_of(std::string_view t) {
  std::vector<Line> out;
  size_t i = 0;
  while (i < t.size()) {
    size_t nl = t.find('\n', i);
    size_t end = nl == std::string_view::npos ? t.size() : nl + 1;
    out.push_back({i, end});
    i = end;
  }
  return out;
}

// Tracks multi-line strings and arrays across lines, so that only real headers count.
struct Scanner {
  enum class In { none, ml_basic, ml_literal } in = In::none;
  int depth = 0;  // open '[' of array values

  bool at_structure_level() const { return in == In::none && depth == 0; }

  // Consumes one non-header line. value_context: an '=' was seen on it (or we are inside an array).
  void feed(std::string_view line) {
    bool value = depth > 0;
    size_t i = 0;
    while (i < line.size()) {
      if (in == In::ml_basic) {
        if (line[i] == '\\') {
          i += 2;
          continue;
        }
        if (line.substr(i, 3) == "\"\"\"") {
          in = In::none;
          i += 3;
          continue;
        }
        ++i;
        continue;
      }
      if (in == In::ml_literal) {
        if (line.substr(i, 3) == "'''") {
          in = In::none;
          i += 3;
          continue;
        }
        ++i;
        continue;
      }
      char c = line[i];
      if (c == '#') return;
      if (c == '"' || c == '\'') {
        std::string_view triple = c == '"' ? "\"\"\"" : "'''";
        if (line.substr(i, 3) == triple) {
          in = c == '"' ? In::ml_basic : In::ml_literal;
          i += 3;
          continue;
        }
        ++i;
        while (i < line.size() && line[i] != c && line[i] != '\n') {
          if (c == '"' && line[i] == '\\') ++i;
          ++i;
        }
        ++i;
        continue;
      }
      if (c == '=') value = true;
      if (value && c == '[') ++depth;
      if (value && c == ']' && depth > 0) --depth;
      ++i;
    }
  }
};

bool comment_or_blank(std::string_view line) {
  std::string_view t = trim(line);
  return t.empty() || t.front() == '#';
}

std::string key_text(const std::vector<std::string>& parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) {
    bool bare = !p.empty() && std::all_of(p.begin(), p.end(), bare_key_char);
    out.push_back(bare ? p : toml_quote(p));
  }
  return join(out, ".");
}

// The key of a `key = value` line, and where its value starts.
std::optional<std::pair<std::vector<std::string>, size_t>> assignment(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && blank(line[i])) ++i;
  if (i >= line.size() || line[i] == '#' || line[i] == '[' || line[i] == '\n') return std::nullopt;
  auto key = parse_key_at(line, i, '=');
  if (!key) return std::nullopt;
  return std::make_pair(*key, i + 1);
}

}  // namespace

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += cat("\\u00", "0123456789abcdef"[(c >> 4) & 0xf], "0123456789abcdef"[c & 0xf]);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::vector<TomlSection> toml_sections(std::string_view text) {
  std::vector<TomlSection> out;
  Scanner scan;
  for (const auto& l : lines_of(text)) {
    std::string_view line = text.substr(l.begin, l.end - l.begin);
    size_t i = 0;
    while (i < line.size() && blank(line[i])) ++i;
    if (scan.at_structure_level() && i < line.size() && line[i] == '[') {
      bool array = i + 1 < line.size() && line[i + 1] == '[';
      size_t k = i + (array ? 2 : 1);
      auto key = parse_key_at(line, k, ']');
      if (key && (!array || (k + 1 < line.size() && line[k + 1] == ']'))) {
        if (!out.empty()) out.back().end = l.begin;
        out.push_back({*key, array, l.begin, l.end, text.size()});
        continue;
      }
    }
    scan.feed(line);
  }
  return out;
}

std::string remove_toml_tables(std::string_view text, const std::vector<std::string>& prefix) {
  auto sections = toml_sections(text);
  auto removed = [&](const TomlSection& s) {
    return s.key.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), s.key.begin());
  };
  std::string out(text.substr(0, sections.empty() ? text.size() : sections.front().begin));
  for (size_t n = 0; n < sections.size(); ++n) {
    const auto& s = sections[n];
    if (!removed(s)) {
      out += text.substr(s.begin, s.end - s.begin);
      continue;
    }
    // Comment lines at the end of a removed table introduce the next one: keep them.
    bool next_kept = n + 1 < sections.size() && !removed(sections[n + 1]);
    if (!next_kept) continue;
    auto lines = lines_of(text.substr(s.body, s.end - s.body));
    size_t keep_from = lines.size();
    while (keep_from > 0 &&
           comment_or_blank(text.substr(s.body + lines[keep_from - 1].begin,
                                        lines[keep_from - 1].end - lines[keep_from - 1].begin)))
      --keep_from;
    if (keep_from < lines.size())
      out += text.substr(s.body + lines[keep_from].begin, s.end - s.body - lines[keep_from].begin);
  }
  return out;
}

std::optional<std::string> set_toml_key(std::string_view text,
                                        const std::vector<std::string>& table, std::string_view key,
                                        std::string_view value_toml) {
  auto sections = toml_sections(text);
  const TomlSection* found = nullptr;
  for (const auto& s : sections) {
    if (s.array_of_tables || s.key != table) continue;
    if (found) return std::nullopt;
    found = &s;
  }
  std::string t(text);
  if (!found) {
    if (!t.empty() && t.back() != '\n') t += '\n';
    return cat(t, "\n[", key_text(table), "]\n  ", key, " = ", value_toml, "\n");
  }
  std::optional<size_t> value_begin, value_end;
  std::string indent;
  for (const auto& l : lines_of(text.substr(found->body, found->end - found->body))) {
    std::string_view line = text.substr(found->body + l.begin, l.end - l.begin);
    auto a = assignment(line);
    if (!a) continue;
    if (indent.empty()) indent = std::string(line.substr(0, line.find_first_not_of(" \t")));
    if (a->first != std::vector<std::string>{std::string(key)}) continue;
    if (value_begin) return std::nullopt;  // assigned twice: not ours to pick
    size_t v = a->second;
    while (v < line.size() && blank(line[v])) ++v;
    if (v >= line.size()) return std::nullopt;
    size_t e = v;
    if (line[v] == '"' || line[v] == '\'') {
      if (line.substr(v, 3) == "\"\"\"" || line.substr(v, 3) == "'''") return std::nullopt;
      char q = line[v];
      e = v + 1;
      while (e < line.size() && line[e] != q && line[e] != '\n') {
        if (q == '"' && line[e] == '\\') ++e;
        ++e;
      }
      if (e >= line.size() || line[e] != q) return std::nullopt;
      ++e;
    } else if (line[v] == '[' || line[v] == '{') {
      return std::nullopt;
    } else {
      while (e < line.size() && line[e] != '#' && line[e] != '\n' && !blank(line[e])) ++e;
    }
    value_begin = found->body + l.begin + v;
    value_end = found->body + l.begin + e;
  }
  if (value_begin) {
    t.replace(*value_begin, *value_end - *value_begin, value_toml);
    return t;
  }
  if (indent.empty()) {
    std::string_view header = text.substr(found->begin, found->body - found->begin);
    indent = std::string(header.substr(0, header.find_first_not_of(" \t"))) + "  ";
  }
  std::string line = cat(indent, key, " = ", value_toml, "\n");
  if (found->body == t.size() && !t.empty() && t.back() != '\n') line = "\n" + line;
  t.insert(found->body, line);
  return t;
}

std::optional<std::string> add_toml_import(std::string_view text, std::string_view entry) {
  auto sections = toml_sections(text);
  size_t top_end = sections.empty() ? text.size() : sections.front().begin;
  std::string t(text);
  std::optional<size_t> after_version;
  for (const auto& l : lines_of(text.substr(0, top_end))) {
    std::string_view line = text.substr(l.begin, l.end - l.begin);
    auto a = assignment(line);
    if (!a) continue;
    if (a->first == std::vector<std::string>{"version"}) after_version = l.end;
    if (a->first != std::vector<std::string>{"imports"}) continue;
    // Walk the array from '[' to its ']' (strings and comments skipped), remembering the last
    // character that is part of an element or a comma.
    size_t i = l.begin + a->second;
    while (i < top_end && blank(t[i])) ++i;
    if (i >= top_end || t[i] != '[') return std::nullopt;
    size_t open = i++;
    std::optional<size_t> last;
    char last_char = 0;
    while (i < top_end && t[i] != ']') {
      char c = t[i];
      if (c == '#') {
        while (i < top_end && t[i] != '\n') ++i;
        continue;
      }
      if (c == '"' || c == '\'') {
        if (t.compare(i, 3, std::string(3, c)) == 0) return std::nullopt;
        size_t e = i + 1;
        while (e < top_end && t[e] != c && t[e] != '\n') {
          if (c == '"' && t[e] == '\\') ++e;
          ++e;
        }
        if (e >= top_end || t[e] != c) return std::nullopt;
        last = e;
        last_char = c;
        i = e + 1;
        continue;
      }
      if (c == '[' || c == '{') return std::nullopt;  // not an array of strings
      if (!blank(c) && c != '\n' && c != '\r') {
        last = i;
        last_char = c;
      }
      ++i;
    }
    if (i >= top_end) return std::nullopt;
    std::string quoted = toml_quote(entry);
    if (!last) {
      t.insert(open + 1, quoted);
    } else if (last_char == ',') {
      t.insert(*last + 1, " " + quoted);
    } else {
      t.insert(*last + 1, ", " + quoted);
    }
    return t;
  }
  std::string line = cat("imports = [", toml_quote(entry), "]\n");
  if (after_version) {
    if (*after_version == t.size() && !t.empty() && t.back() != '\n') line = "\n" + line;
    t.insert(*after_version, line);
  } else {
    t.insert(0, line);
  }
  return t;
}

}  // namespace gpufence
