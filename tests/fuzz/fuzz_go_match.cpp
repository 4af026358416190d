// libFuzzer target: Go's path.Match (common/go_match.hpp), the matcher gpufence judges
// containerd's pod_annotations patterns with. Input: pattern NUL prefix (the rest ignored).
// Oracles beyond "no crash":
//  - the port of match.go and the automaton behind go_path_match_with_prefix agree on
//    every ASCII name: with the name as the prefix, the search answers the name itself exactly
//    when Match accepts it;
//  - "no string with this prefix matches" (searched over suffixes of the pattern's own ASCII
//    bytes, '/' and 'x') survives brute force over every such suffix of up to three characters;
//  - a "yes" carries a witness that Match accepts (checked inside; a disagreement is an
//    Errc::internal error, which aborts here);
//  - validity does not depend on the name: a malformed pattern errs for every name.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/go_match.hpp"

using namespace gpufence;

namespace {

constexpr size_t kMaxStates = 4000;

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t nul = in.find('\0');
  std::string_view pattern = in.substr(0, nul);
  std::string_view prefix = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  prefix = prefix.substr(0, prefix.find('\0'));
  if (pattern.size() > 32 || prefix.size() > 12) return 0;

  auto direct = go_path_match(pattern, prefix);
  auto other = go_path_match(pattern, "x/y");
  if (direct.has_value() != other.has_value()) std::abort();  // validity is the pattern's alone
  if (!is_ascii(prefix)) return 0;

  // The suffixes searched and brute-forced alike: the pattern's own ASCII bytes, '/' and 'x'.
  std::set<char> letters = {'/', 'x'};
  for (char c : pattern)
    if (static_cast<unsigned char>(c) < 0x80 && letters.size() < 8) letters.insert(c);
  const std::string alphabet(letters.begin(), letters.end());
  auto search = go_path_match_with_prefix(pattern, prefix, {alphabet, 0}, kMaxStates);
  if (!search) {
    if (search.error().code == Errc::internal) std::abort();
    if (search.error().code == Errc::parse && direct) std::abort();
    return 0;
  }
  if (!direct) std::abort();  // the search read a malformed pattern as well formed
  bool accepts_prefix = search->has_value() && **search == prefix;
  if (accepts_prefix != *direct) std::abort();
  if (search->has_value()) return 0;

  std::vector<std::string> suffixes = {""};
  for (int len = 0; len <= 3; ++len) {
    std::vector<std::string> longer;
    for (const auto& s : suffixes) {
      auto m = go_path_match(pattern, std::string(prefix) + s);
      if (m && *m) std::abort();  // a match the search said did not exist
      if (len < 3)
        for (char c : alphabet) longer.push_back(s + c);
    }
    suffixes = std::move(longer);
  }
  return 0;
}
