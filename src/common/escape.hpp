// The one escaping of bytes a pod controls (its env, annotations, file contents, names) on their
// way into a log line or a report: data, never syntax. A "\x1b[..." would drive the reader's
// terminal, a "\r" or "\n" would forge a line, and a "$(...)" or backtick in a line appended to
// a file a shell reads would run. docs/trust-model.md, "Pod-controlled bytes".
#pragma once

#include <string>
#include <string_view>

namespace gpufence {

// One printable line: C0 and C1 controls, DEL and bytes that are not well-formed UTF-8 (overlong,
// surrogate, truncated, above U+10FFFF) become \xNN, a backslash becomes "\\", and so does every
// byte listed in `also` (\xNN). Other UTF-8 passes unchanged.
std::string escape_text(std::string_view in, std::string_view also = {});

// A log field's value: escape_text with quotes, '$', backtick, ';', '&', '|', '<' and '>' escaped
// too (no command substitution, no second command, no redirection even if a shell read the line),
// then wrapped
// in double quotes when empty or holding a space, '=' or '#', so "key=value" stays splittable.
std::string log_value(std::string_view value);

}  // namespace gpufence
