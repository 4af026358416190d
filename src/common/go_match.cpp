#include "common/go_match.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpufence {
namespace {

constexpr char32_t kRuneError = 0xFFFD;

struct Rune {
  char32_t value;
  size_t size;
};

// Go's utf8.DecodeRuneInString for a non-empty s: an invalid, overlong, surrogate or truncated
// encoding reads as (RuneError, 1).
Rune decode_rune(std::string_view s) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  auto cont = [&](size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i < s.size() && b(i) >= lo && b(i) <= hi;
  };
  unsigned char b0 = b(0);
  if (b0 < 0x80) return {b0, 1};
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1))
    return {static_cast<char32_t>((b0 & 0x1F) << 6 | (b(1) & 0x3F)), 2};
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (cont(1, lo, hi) && cont(2))
      return {static_cast<char32_t>((b0 & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F)), 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (cont(1, lo, hi) && cont(2) && cont(3))
      return {static_cast<char32_t>((b0 & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 |
                                    (b(3) & 0x3F)),
              4};
  }
  return {kRuneError, 1};
}

// ---- The port of match.go, function for function. ----

struct ScannedChunk {
  bool star;
  std::string_view chunk, rest;
};

// scanChunk: the next run of non-'*' terms, and whether '*'s came before it. A '*' inside what
// looks like a class ('[' seen, ']' not yet) stays in the chunk; '\\' skips the next byte.
ScannedChunk scan_chunk(std::string_view pattern) {
  bool star = false;
  while (!pattern.empty() && pattern.front() == '*') {
    pattern.remove_prefix(1);
    star = true;
  }
  bool inrange = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    switch (pattern[i]) {
      case '\\':
        if (i + 1 < pattern.size()) ++i;
        break;
      case '[':
        inrange = true;
        break;
      case ']':
        inrange = false;
        break;
      case '*':
        if (!inrange) return {star, pattern.substr(0, i), pattern.substr(i)};
        break;
      default:
        break;
    }
  }
  return {star, pattern, {}};
}

struct Escaped {
  char32_t rune = 0;
  std::string_view rest;
  bool bad = false;
};

// getEsc: one possibly escaped rune of a class; bad when missing, '-' or ']' unescaped, invalid
// UTF-8, or the last byte of the pattern (a class must still be closed).
Escaped get_esc(std::string_view chunk) {
  if (chunk.empty() || chunk.front() == '-' || chunk.front() == ']') return {0, {}, true};
  if (chunk.front() == '\\') {
    chunk.remove_prefix(1);
    if (chunk.empty()) return {0, {}, true};
  }
  Rune r = decode_rune(chunk);
  Escaped out{r.value, chunk.substr(r.size), false};
  if (r.value == kRuneError && r.size == 1) out.bad = true;
  if (out.rest.empty()) out.bad = true;
  return out;
}

struct ChunkMatch {
  std::string_view rest;
  bool ok = false;
  bool bad = false;
};

// matchChunk: whether the chunk matches the start of s. After a mismatch it keeps parsing the
// chunk (no longer reading s), so a malformed chunk is reported whatever s is.
ChunkMatch match_chunk(std::string_view chunk, std::string_view s) {
  bool failed = false;
  while (!chunk.empty()) {
    if (!failed && s.empty()) failed = true;
    switch (chunk.front()) {
      case '[': {
        char32_t r = 0;
        if (!failed) {
          Rune d = decode_rune(s);
          r = d.value;
          s.remove_prefix(d.size);
        }
        chunk.remove_prefix(1);
        bool negated = false;
        if (!chunk.empty() && chunk.front() == '^') {
          negated = true;
          chunk.remove_prefix(1);
        }
        bool match = false;
        int nrange = 0;
        for (;;) {
          if (!chunk.empty() && chunk.front() == ']' && nrange > 0) {
            chunk.remove_prefix(1);
            break;
          }
          Escaped lo = get_esc(chunk);
          if (lo.bad) return {{}, false, true};
          chunk = lo.rest;
          char32_t hi = lo.rune;
          if (chunk.front() == '-') {
            Escaped h = get_esc(chunk.substr(1));
            if (h.bad) return {{}, false, true};
            chunk = h.rest;
            hi = h.rune;
          }
          if (lo.rune <= r && r <= hi) match = true;
          ++nrange;
        }
        if (match == negated) failed = true;
        break;
      }
      case '?':
        if (!failed) {
          if (s.front() == '/') failed = true;
          s.remove_prefix(decode_rune(s).size);
        }
        chunk.remove_prefix(1);
        break;
      case '\\':
        chunk.remove_prefix(1);
        if (chunk.empty()) return {{}, false, true};
        [[fallthrough]];
      default:
        if (!failed) {
          if (chunk.front() != s.front()) failed = true;
          s.remove_prefix(1);
        }
        chunk.remove_prefix(1);
        break;
    }
  }
  if (failed) return {};
  return {s, true, false};
}

std::unexpected<Error> bad_pattern(std::string_view pattern) {
  // Go's ErrBadPattern text.
  return fail(Errc::parse, "syntax error in pattern \"", pattern, "\"");
}

// ---- The same matching as an automaton over ASCII names, for the existence question. ----

// One single-character term of a chunk, as matchChunk reads it.
struct Term {
  enum class Kind { literal, any_but_slash, char_class } kind = Kind::literal;
  unsigned char byte = 0;
  bool negated = false;
  std::vector<std::pair<char32_t, char32_t>> ranges;

  // On an ASCII name every term consumes exactly one byte.
  bool matches(unsigned char c) const {
    switch (kind) {
      case Kind::literal:
        return c == byte;
      case Kind::any_but_slash:
        return c != '/';
      case Kind::char_class: {
        bool in = false;
        for (auto [lo, hi] : ranges) in |= lo <= c && c <= hi;
        return in != negated;
      }
    }
    return false;
  }
};

struct Chunk {
  bool star = false;
  std::vector<Term> terms;
};

// The chunk's terms, parsed exactly as matchChunk parses them; nullopt where it reports
// ErrBadPattern.
std::optional<std::vector<Term>> parse_terms(std::string_view chunk) {
  std::vector<Term> terms;
  while (!chunk.empty()) {
    Term t;
    switch (chunk.front()) {
      case '[': {
        t.kind = Term::Kind::char_class;
        chunk.remove_prefix(1);
        if (!chunk.empty() && chunk.front() == '^') {
          t.negated = true;
          chunk.remove_prefix(1);
        }
        for (;;) {
          if (!chunk.empty() && chunk.front() == ']' && !t.ranges.empty()) {
            chunk.remove_prefix(1);
            break;
          }
          Escaped lo = get_esc(chunk);
          if (lo.bad) return std::nullopt;
          chunk = lo.rest;
          char32_t hi = lo.rune;
          if (chunk.front() == '-') {
            Escaped h = get_esc(chunk.substr(1));
            if (h.bad) return std::nullopt;
            chunk = h.rest;
            hi = h.rune;
          }
          t.ranges.emplace_back(lo.rune, hi);
        }
        break;
      }
      case '?':
        t.kind = Term::Kind::any_but_slash;
        chunk.remove_prefix(1);
        break;
      case '\\':
        chunk.remove_prefix(1);
        if (chunk.empty()) return std::nullopt;
        [[fallthrough]];
      default:
        t.byte = static_cast<unsigned char>(chunk.front());
        chunk.remove_prefix(1);
        break;
    }
    terms.push_back(std::move(t));
  }
  return terms;
}

// Match's loop over chunks, as an automaton. State: the chunk being searched, the candidate
// starts of it still alive (alive[k]: a start whose first k terms matched), and whether a new
// start may still begin (not after '/', which '*' cannot cross; never again for a first chunk
// without '*'). A chunk with a later one commits at its first completed candidate: every term
// is one byte on ASCII names, so the first to complete is the leftmost start, the one Match
// takes. The last chunk never commits: Match accepts when any allowed start ends at the end.
// A trailing '*' (empty chunk) accepts while no '/' comes.
class MatchAutomaton {
 public:
  struct State {
    size_t chunk = 0;  // == chunks.size(): the pattern is done, only the end may follow
    bool dead = false;
    bool starts = false;
    std::string alive;  // '0'/'1' per k in 0..L
    std::string key() const { return cat(chunk, dead ? 'd' : '-', starts ? 's' : '-', alive); }
  };

  explicit MatchAutomaton(std::vector<Chunk> chunks) : m_chunks(std::move(chunks)) {}

  State initial() const { return enter(0); }

  State step(const State& s, unsigned char c) const {
    if (s.dead || s.chunk == m_chunks.size()) return dead();
    const Chunk& ch = m_chunks[s.chunk];
    if (ch.terms.empty()) return c == '/' ? dead() : s;  // trailing '*'
    size_t len = ch.terms.size();
    State next = s;
    next.alive.assign(len + 1, '0');
    for (size_t k = 0; k < len; ++k)
      if (s.alive[k] == '1' && ch.terms[k].matches(c)) next.alive[k + 1] = '1';
    next.starts = s.starts && c != '/';
    if (commits(s.chunk) && next.alive[len] == '1') return enter(s.chunk + 1);
    if (next.starts) next.alive[0] = '1';
    if (next.alive.find('1') == std::string::npos) return dead();
    return next;
  }

  bool accepts(const State& s) const {
    if (s.dead) return false;
    if (s.chunk == m_chunks.size()) return true;
    const Chunk& ch = m_chunks[s.chunk];
    if (ch.terms.empty()) return true;
    return !commits(s.chunk) && s.alive.back() == '1';
  }

 private:
  bool commits(size_t i) const { return i + 1 < m_chunks.size(); }
  static State dead() {
    State s;
    s.dead = true;
    return s;
  }
  State enter(size_t i) const {
    State s;
    s.chunk = i;
    if (i == m_chunks.size() || m_chunks[i].terms.empty()) return s;
    s.starts = m_chunks[i].star;
    s.alive.assign(m_chunks[i].terms.size() + 1, '0');
    s.alive[0] = '1';  // the start at the current position: anchored, or an empty '*'
    return s;
  }

  std::vector<Chunk> m_chunks;
};

std::string every_ascii_byte() {
  std::string all;
  for (int c = 0; c < 128; ++c) all.push_back(static_cast<char>(c));
  return all;
}

}  // namespace

Result<bool> go_path_match(std::string_view pattern, std::string_view name) {
  const std::string_view whole = pattern;
  while (!pattern.empty()) {
    ScannedChunk sc = scan_chunk(pattern);
    pattern = sc.rest;
    // A trailing '*' matches the rest of the name unless it has a '/'.
    if (sc.star && sc.chunk.empty()) return name.find('/') == std::string_view::npos;
    ChunkMatch m = match_chunk(sc.chunk, name);
    // The last chunk must exhaust the name; any other takes its first match.
    if (m.ok && (m.rest.empty() || !pattern.empty())) {
      name = m.rest;
      continue;
    }
    if (m.bad) return bad_pattern(whole);
    if (sc.star) {
      bool advanced = false;
      // Look for a match skipping i+1 bytes; '*' cannot skip '/'.
      for (size_t i = 0; i < name.size() && name[i] != '/'; ++i) {
        ChunkMatch t = match_chunk(sc.chunk, name.substr(i + 1));
        if (t.ok) {
          if (pattern.empty() && !t.rest.empty()) continue;
          name = t.rest;
          advanced = true;
          break;
        }
        if (t.bad) return bad_pattern(whole);
      }
      if (advanced) continue;
    }
    // Before answering false, the rest of the pattern must be well formed.
    while (!pattern.empty()) {
      ScannedChunk rest = scan_chunk(pattern);
      pattern = rest.rest;
      if (match_chunk(rest.chunk, {}).bad) return bad_pattern(whole);
    }
    return false;
  }
  return name.empty();
}

Result<std::optional<std::string>> go_path_match_with_prefix(std::string_view pattern,
                                                             std::string_view prefix,
                                                             SuffixSpace space, size_t max_states) {
  static const std::string all_ascii = every_ascii_byte();
  const std::string_view alphabet = space.alphabet.empty() ? all_ascii : space.alphabet;
  for (std::string_view s : {prefix, alphabet})
    for (char c : s)
      if (static_cast<unsigned char>(c) >= 0x80)
        return fail(Errc::invalid_argument, "\"", s, "\" is not ASCII");

  // Step 1: the chunks, as scanChunk cuts them and matchChunk parses them.
  std::vector<Chunk> chunks;
  for (std::string_view rest = pattern; !rest.empty();) {
    ScannedChunk sc = scan_chunk(rest);
    rest = sc.rest;
    auto terms = parse_terms(sc.chunk);
    if (!terms) return bad_pattern(pattern);
    chunks.push_back({sc.star, std::move(*terms)});
  }
  MatchAutomaton automaton(std::move(chunks));

  // Step 2: the fixed prefix decides the state deterministically.
  MatchAutomaton::State start = automaton.initial();
  for (char c : prefix) start = automaton.step(start, static_cast<unsigned char>(c));
  if (start.dead) return std::nullopt;

  // Step 3: breadth first over the suffixes, so the witness is the shortest. A node is a state
  // and how much of the minimum length is behind it.
  struct Node {
    MatchAutomaton::State state;
    size_t length;
    size_t parent;
    char via;
  };
  auto key_of = [&](const MatchAutomaton::State& st, size_t length) {
    return cat(std::min(length, space.min_length), '/', st.key());
  };
  auto accepted = [&](const Node& n) {
    return n.length >= space.min_length && automaton.accepts(n.state);
  };
  std::vector<Node> nodes{{start, 0, 0, 0}};
  std::unordered_map<std::string, size_t> seen{{key_of(start, 0), 0}};
  auto witness = [&](size_t at) -> Result<std::optional<std::string>> {
    std::string suffix;
    for (; at != 0; at = nodes[at].parent) suffix.insert(suffix.begin(), nodes[at].via);
    std::string key = std::string(prefix) + suffix;
    // The automaton and the port must agree; a disagreement is our bug, never a verdict.
    auto check = go_path_match(pattern, key);
    if (!check || !*check)
      return fail(Errc::internal, "path.Match automaton accepts \"", key, "\" for \"", pattern,
                  "\" but Match does not");
    return key;
  };
  if (accepted(nodes[0])) return witness(0);
  for (size_t at = 0; at < nodes.size(); ++at) {
    for (char c : alphabet) {
      MatchAutomaton::State next = automaton.step(nodes[at].state, static_cast<unsigned char>(c));
      if (next.dead) continue;
      size_t length = nodes[at].length + 1;
      auto [it, fresh] = seen.emplace(key_of(next, length), nodes.size());
      if (!fresh) continue;
      nodes.push_back({std::move(next), length, at, c});
      if (accepted(nodes.back())) return witness(nodes.size() - 1);
      if (nodes.size() > max_states)
        return fail(Errc::unsupported, "pattern \"", pattern, "\" needs more than ", max_states,
                    " states to judge");
    }
  }
  return std::nullopt;
}

}  // namespace gpufence
