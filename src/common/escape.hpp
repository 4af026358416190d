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

// How much of one pod-controlled string a refusal quotes (docs/trust-model.md): a mountPath or an
// annotation can be megabytes, and an answer to containerd must stay small.
inline constexpr size_t kExcerptBytes = 256;

// escape_text, stopped once the output holds `max_bytes` (a character more at most), then
// "...(N bytes)" with the input's length: a pod string quoted in a message, bounded.
std::string escape_excerpt(std::string_view in, size_t max_bytes = kExcerptBytes,
                           std::string_view also = {});

// A message whose pod bytes were already escaped once (escape_text/escape_excerpt), made one
// bounded printable line: controls and bytes that are not UTF-8 become \xNN, a backslash stays
// as it is (escaping it again would double every escape), and the text is cut at `max_bytes`
// with its length named as escape_excerpt does.
std::string bounded_line(std::string_view escaped, size_t max_bytes);

// A log field's value: escape_text with quotes, '$', backtick, ';', '&', '|', '<' and '>' escaped
// too (no command substitution, no second command, no redirection even if a shell read the line),
// then wrapped
// in double quotes when empty or holding a space, '=' or '#', so "key=value" stays splittable.
std::string log_value(std::string_view value);

}  // namespace gpufence
