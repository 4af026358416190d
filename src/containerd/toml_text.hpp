// Line-level edits of a TOML file's text, so `gpufence setup containerd` changes only the lines it
// means to and the user's comments and layout stay byte for byte. Every edit here is a proposal:
// the caller parses the result and compares it with the document it wants (setup.cpp), and falls
// back to re-serialising only when the two differ.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpufence {

// One table header of a TOML text and the text it owns: [begin, body) is the header line, [body,
// end) the lines up to the next header. Headers inside multi-line strings or arrays are skipped.
struct TomlSection {
  std::vector<std::string> key;
  bool array_of_tables = false;
  size_t begin = 0, body = 0, end = 0;
};
std::vector<TomlSection> toml_sections(std::string_view text);

// The text with every table whose key starts with `prefix` (the table and its sub-tables) cut out.
std::string remove_toml_tables(std::string_view text, const std::vector<std::string>& prefix);

// Sets `key = value_toml` in table `table` (value_toml is already TOML: "\"nvidia\""): replaces the
// value of an existing one-line assignment, else adds the line under the table's header, else
// appends the table. nullopt when the key is assigned on several lines or over several lines.
std::optional<std::string> set_toml_key(std::string_view text,
                                        const std::vector<std::string>& table, std::string_view key,
                                        std::string_view value_toml);

// Adds `entry` to the top-level `imports` array (created after `version = N` when absent).
// nullopt when the existing array cannot be found on the top level by lines.
std::optional<std::string> add_toml_import(std::string_view text, std::string_view entry);

// A TOML basic string: "…" with ", \ and control characters escaped.
std::string toml_quote(std::string_view s);

}  // namespace gpufence
