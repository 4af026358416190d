#include "common/go_match.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace gpufence;

namespace {

struct Case {
  const char* pattern;
  const char* name;
  bool match;
  bool bad;  // Go answers ErrBadPattern
};

// Every case of Go's src/path/match_test.go (matchTests), in its order.
const std::vector<Case> kGoMatchTests = {
    {"abc", "abc", true, false},
    {"*", "abc", true, false},
    {"*c", "abc", true, false},
    {"a*", "a", true, false},
    {"a*", "abc", true, false},
    {"a*", "ab/c", false, false},
    {"a*/b", "abc/b", true, false},
    {"a*/b", "a/c/b", false, false},
    {"a*b*c*d*e*/f", "axbxcxdxe/f", true, false},
    {"a*b*c*d*e*/f", "axbxcxdxexxx/f", true, false},
    {"a*b*c*d*e*/f", "axbxcxdxe/xxx/f", false, false},
    {"a*b*c*d*e*/f", "axbxcxdxexxx/fff", false, false},
    {"a*b?c*x", "abxbbxdbxebxczzx", true, false},
    {"a*b?c*x", "abxbbxdbxebxczzy", false, false},
    {"ab[c]", "abc", true, false},
    {"ab[b-d]", "abc", true, false},
    {"ab[e-g]", "abc", false, false},
    {"ab[^c]", "abc", false, false},
    {"ab[^b-d]", "abc", false, false},
    {"ab[^e-g]", "abc", true, false},
    {"a\\*b", "a*b", true, false},
    {"a\\*b", "ab", false, false},
    {"a?b", "a\u263Ab", true, false},
    {"a[^a]b", "a\u263Ab", true, false},
    {"a???b", "a\u263Ab", false, false},
    {"a[^a][^a][^a]b", "a\u263Ab", false, false},
    {"[a-\u03B6]*", "\u03B1", true, false},
    {"*[a-\u03B6]", "A", false, false},
    {"a?b", "a/b", false, false},
    {"a*b", "a/b", false, false},
    {"[\\]a]", "]", true, false},
    {"[\\-]", "-", true, false},
    {"[x\\-]", "x", true, false},
    {"[x\\-]", "-", true, false},
    {"[x\\-]", "z", false, false},
    {"[\\-x]", "x", true, false},
    {"[\\-x]", "-", true, false},
    {"[\\-x]", "a", false, false},
    {"[]a]", "]", false, true},
    {"[-]", "-", false, true},
    {"[x-]", "x", false, true},
    {"[x-]", "-", false, true},
    {"[x-]", "z", false, true},
    {"[-x]", "x", false, true},
    {"[-x]", "-", false, true},
    {"[-x]", "a", false, true},
    {"\\", "a", false, true},
    {"[a-b-c]", "a", false, true},
    {"[", "a", false, true},
    {"[^", "a", false, true},
    {"[^bc", "a", false, true},
    {"a[", "a", false, true},
    {"a[", "ab", false, true},
    {"a[", "x", false, true},
    {"a/b[", "x", false, true},
    {"*x", "xxx", true, false},
};

void expect_case(const Case& c) {
  auto got = go_path_match(c.pattern, c.name);
  if (c.bad) {
    ASSERT_FALSE(got) << "Match(" << c.pattern << ", " << c.name << ") should be ErrBadPattern";
    EXPECT_EQ(got.error().code, Errc::parse);
  } else {
    ASSERT_TRUE(got) << c.pattern << ": " << got.error().message;
    EXPECT_EQ(*got, c.match) << "Match(" << c.pattern << ", " << c.name << ")";
  }
}

}  // namespace

TEST(GoPathMatch, UpstreamMatchTests) {
  for (const auto& c : kGoMatchTests) expect_case(c);
}

// What match.go's code does beyond its test table, each read from the code.
TEST(GoPathMatch, WhatTheCodeDoes) {
  for (const auto& c : std::vector<Case>{
           // A class is not '?': it matches '/'.
           {"a[/]b", "a/b", true, false},
           {"a[^x]b", "a/b", true, false},
           {"a[!-0]b", "a/b", true, false},
           // Leftmost commit, no backtracking across '*': the documented grammar would say yes.
           {"*[a/][a/]*b", "a//b", false, false},
           {"*[a/][a/]*b", "aa/b", false, false},
           {"*[a/][a/]*b", "xaab", true, false},
           // A malformed tail is reported even when the head already failed or matched.
           {"x*[", "abc", false, true},
           {"a*b[", "ab", false, true},
           {"a\\", "a", false, true},
           // A '*' inside something that looks like a class stays there ("[*]" is the class {*}).
           {"[*]", "*", true, false},
           {"[a[]*]", "[xy]", true, false},
           // Invalid UTF-8 in a name is one U+FFFD rune to '?' and to classes.
           {"a?b", "a\xff" "b", true, false},
           {"a[^x]b", "a\xff" "b", true, false},
           // ...and inside a class it is a malformed pattern.
           {"[\xff]", "a", false, true},
           {"", "", true, false},
           {"", "a", false, false},
           {"**", "a/b", false, false},
       })
    expect_case(c);
}

// The existence question the containerd check asks.
TEST(GoPathMatchWithPrefix, FindsAKeyOrProvesNone) {
  const std::string prefix = "cdi.k8s.io/";
  // Annotation names, as the containerd check searches them.
  const SuffixSpace names{"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-._", 1};
  for (const char* p :
       {"cdi.k8s.io/*", "*/*", "cdi.*/*", "cdi.k8s.io/nvidia.com_gpu", "c?i.k8s.io/x",
        "[c]di.k8s.io/*", "cdi.k8s.io\\/*", "cdi.k8s.io[/]*", "cdi.k8s.io[^a]*", "[a-d]di.k8s.io/x",
        "cdi.k8s.io[!-0]*", "\\c\\d\\i.k8s.io/*", "*.io[/]?", "cdi.k8s.io/[", "*[/]*",
        "cdi.k8s.io[^x][^x]*", "[b-d][^z]i*[/]*"}) {
    auto w = go_path_match_with_prefix(p, prefix, names);
    if (std::string(p) == "cdi.k8s.io/[") {  // malformed: matches nothing, and says so
      ASSERT_FALSE(w);
      EXPECT_EQ(w.error().code, Errc::parse);
      continue;
    }
    ASSERT_TRUE(w) << p << ": " << w.error().message;
    ASSERT_TRUE(w->has_value()) << p;
    EXPECT_TRUE((*w)->starts_with(prefix)) << **w;
    EXPECT_TRUE(go_path_match(p, **w).value()) << p << " " << **w;
  }
  for (const char* p :
       {"*", "cdi.k8s.io", "io.katacontainers.*", "cdi.k8s.io/", "*/*/*", "example.com/*",
        "cdi.k8s.ioo/*", "cdi.k8s.io?*", "cdi.k8s.io*", "cdi.k8s.io[^/]*", "[^c]di.k8s.io/*",
        // Leftmost commit: the class takes the '.' after "cdi", and the trailing
        // '*' then meets the '/': Match never passes a cdi.k8s.io/ key.
        "cdi*[./]*"}) {
    auto w = go_path_match_with_prefix(p, prefix, names);
    ASSERT_TRUE(w) << p << ": " << w.error().message;
    EXPECT_FALSE(w->has_value()) << p << " admits " << **w;
  }
}

// Small patterns against every short suffix: the search and brute force with the port agree.
TEST(GoPathMatchWithPrefix, AgreesWithBruteForce) {
  const std::string prefix = "a/";
  const std::string alphabet = "a/x";
  const std::vector<std::string> patterns = {"a/*",         "*/*",       "a[/]*",   "*[a/][a/]*",
                                             "?/x",         "a*[/x]",    "[^x]/*x", "a[/]?*x",
                                             "*[/a]x*",     "a\\/[ax]",  "*x",      "a*/?",
                                             "[a-b]/[!-z]", "*[/]*[/]*", "a/*/x"};
  for (const auto& p : patterns) {
    bool brute = false;
    std::vector<std::string> suffixes = {""};
    for (int len = 0; len <= 4 && !brute; ++len) {
      std::vector<std::string> longer;
      for (const auto& s : suffixes) {
        if (go_path_match(p, prefix + s).value()) brute = true;
        for (char c : alphabet) longer.push_back(s + c);
      }
      suffixes = std::move(longer);
    }
    auto w = go_path_match_with_prefix(p, prefix, {alphabet, 0});
    ASSERT_TRUE(w) << p;
    EXPECT_EQ(w->has_value(), brute) << p;
  }
}

TEST(GoPathMatchWithPrefix, SuffixSpaceIsHonoured) {
  // The bare prefix matches, but an annotation name has at least one character.
  EXPECT_EQ(go_path_match_with_prefix("cdi.k8s.io/", "cdi.k8s.io/").value(), "cdi.k8s.io/");
  EXPECT_EQ(go_path_match_with_prefix("cdi.k8s.io/", "cdi.k8s.io/", {"ab", 1}).value(),
            std::nullopt);
  // Only characters of the alphabet are tried, in its order.
  EXPECT_EQ(go_path_match_with_prefix("p[/]?", "p", {"y/x", 0}).value(), "p/y");
  EXPECT_EQ(go_path_match_with_prefix("p/[!]", "p/", {"ab", 0}).value(), std::nullopt);
  EXPECT_FALSE(go_path_match_with_prefix("p*", "p", {"\xc3", 0}));
}

TEST(GoPathMatchWithPrefix, StopsAtTheStateBound) {
  // Each '?' multiplies the live starts: a bound of 3 states is passed and said so.
  auto w = go_path_match_with_prefix("*a?????????b*", "", {}, 3);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code, Errc::unsupported);
}
