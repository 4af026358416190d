// Go's path.Match, exactly (Go src/path/match.go: Match, scanChunk, matchChunk, getEsc), for the
// patterns other programs match with it: containerd's pod_annotations/container_annotations
// (docs/containerd-setup.md). Facts the code keeps, all from match.go:
//  - the pattern is cut at every '*' outside a class into chunks of single-character terms:
//    a literal byte, '\\' c (the byte c), '?' (one rune, never '/'), '[' ['^'] ranges ']' (one
//    rune; a class CAN match '/': only '*' and '?' exclude it);
//  - '*' matches a run of non-'/' bytes; the name is read as UTF-8 one rune at a time by '?' and
//    classes (an invalid byte is one U+FFFD), byte by byte by literals;
//  - every chunk but the last is committed at its leftmost match after the previous one, with
//    no backtracking: Match("*[a/][a/]*b", "a//b") is false although the documented grammar
//    admits it (the first class pair takes "a/", and the next '*' cannot cross the second '/');
//  - a malformed pattern (ErrBadPattern: '\\' at the end, an unclosed or empty class, a range
//    missing an end, invalid UTF-8 inside a class) matches no name, whatever the name.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace gpufence {

// Go's Match(pattern, name): true/false, or Errc::parse for a malformed pattern (ErrBadPattern).
Result<bool> go_path_match(std::string_view pattern, std::string_view name);

// Which strings after the prefix the search below considers.
struct SuffixSpace {
  std::string_view alphabet;  // the characters a suffix may use (ASCII); empty: every ASCII byte
  size_t min_length = 0;
};

// The shortest string `prefix` + suffix (suffix from `space`, characters tried in the
// alphabet's order) that go_path_match accepts, nullopt when there is none. Exact, not a
// heuristic: Match's leftmost-commit search over ASCII names is run as an automaton (state:
// the chunk being searched, which of its candidate starts are still alive, whether a '/' has
// closed the gap before the next start) and searched breadth first after the prefix; the
// witness is then checked with go_path_match. Errc::parse for a malformed pattern;
// Errc::unsupported when the search passes `max_states` (callers that guard a trust boundary
// treat that as "matches"); Errc::invalid_argument for a non-ASCII prefix or alphabet.
Result<std::optional<std::string>> go_path_match_with_prefix(std::string_view pattern,
                                                             std::string_view prefix,
                                                             SuffixSpace space = {},
                                                             size_t max_states = 100000);

}  // namespace gpufence
