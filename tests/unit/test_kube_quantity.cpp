// Resource quantities as k8s.io/apimachinery ParseQuantity reads them (docs/autoscale.md,
// "Quantities"): literal strings, the values upstream gives them, and its refusals.
#include <gtest/gtest.h>

#include <limits>

#include "kube/quantity.hpp"

using namespace gpufence;

namespace {

std::string value_of(std::string_view text) {
  auto q = parse_quantity(text);
  return q ? format_quantity(*q) : "error: " + q.error().message;
}

}  // namespace

TEST(KubeQuantity, ValuesAsParseQuantityGivesThem) {
  struct Case {
    const char* text;
    const char* value;
  } cases[] = {
      {"0", "0"},
      {"1", "1"},
      {"1k", "1000"},
      {"1e3", "1000"},
      {"1E3", "1000"},
      {"1e+3", "1000"},
      {"1e-3", "0.001"},
      {"500m", "0.5"},
      {"1500m", "1.5"},
      {"1u", "0.000001"},
      {"1n", "0.000000001"},
      {"1M", "1000000"},
      {"2G", "2000000000"},
      {"1T", "1000000000000"},
      {"1P", "1000000000000000"},
      {"1E", "1000000000000000000"},  // exa, not an exponent
      {"1Ki", "1024"},
      {"1Mi", "1048576"},
      {"1.5Gi", "1610612736"},
      {"1Ti", "1099511627776"},
      {"1Pi", "1125899906842624"},
      {"1Ei", "1152921504606846976"},
      {"-1", "-1"},
      {"+1", "1"},
      {"-0", "0"},
      {"007", "7"},
      {".5", "0.5"},
      {"1.", "1"},
      {"1.G", "1000000000"},    // upstream allows an empty fraction
      {"0.1n", "0.000000001"},  // rounded up to 1n, never to 0
      {"1e-10", "0.000000001"},
      {"-1e-10", "-0.000000001"},
      {"1.0000000001", "1.000000001"},
      {"9223372036854775807", "9223372036854775807"},
      {"9223372036854775808", "9223372036854775807"},  // clamped at maxAllowed
      {"8Ei", "9223372036854775807"},
      {"1e30", "9223372036854775807"},
      {"123456789012345678901234567890", "9223372036854775807"},
      // The fast path's quirks: a sign, a point or nothing before a suffix reads as 0 ...
      {"-", "0"},
      {"+", "0"},
      {".", "0"},
      {"k", "0"},
      {"Ki", "0"},
      {"Ti", "0"},
      // ... and the exponent is cut to int32 as upstream's int32(parsed) does.
      {"1e4294967296", "1"},
      {"1e2147483648", "0.000000001"},
  };
  for (const auto& c : cases) EXPECT_EQ(value_of(c.text), c.value) << c.text;
}

TEST(KubeQuantity, WhatParseQuantityRefusesIsAnError) {
  for (const char* text :
       {"",      " 1",  "1 ",    "1K",   "1ki",   "1KI", "1e",  "1e+",
        "1.5.5", "abc", "1e1.5", "0x10", "1_000", "--1", "+-1", "1e99999999999999999999",
        "1 k",   "1kk", "1Mi5",  "1mi",  "1i",    "Pi",  "Ei",  ".e-10",
        "-e-10", "1\n"}) {
    auto q = parse_quantity(text);
    EXPECT_FALSE(q) << "'" << text << "' read as " << format_quantity(*q);
  }
  EXPECT_FALSE(parse_quantity(std::string_view("1\0", 2)));
}

TEST(KubeQuantity, FormattedValuesParseBackEqual) {
  for (const char* text : {"1", "500m", "1.5Gi", "-1e-10", "9223372036854775808", "0.1n",
                           "123.456789", "1Ei", "-7k", "0"}) {
    auto q = parse_quantity(text).value();
    auto again = parse_quantity(format_quantity(q));
    ASSERT_TRUE(again) << text;
    EXPECT_EQ(*again, q) << text << " -> " << format_quantity(q);
  }
}

TEST(KubeQuantity, CountsOfAnIntegerResource) {
  EXPECT_EQ(parse_count("2"), 2);
  EXPECT_EQ(parse_count("1k"), 1000);
  EXPECT_EQ(parse_count("1e3"), 1000);
  EXPECT_EQ(parse_count("1000m"), 1) << "whole, written in milli";
  EXPECT_EQ(parse_count("1Ki"), 1024);
  EXPECT_EQ(parse_count("9223372036854775807"), std::numeric_limits<long>::max());
  EXPECT_EQ(parse_count("1e30"), std::numeric_limits<long>::max()) << "clamped, not wrapped";
  // ValidateResourceQuantityValue admits MilliValue() % 1000 == 0 (MilliValue rounds up); the
  // scheduler and the kubelet then count Value(), rounded up.
  EXPECT_EQ(parse_count("0.9999"), 1);
  for (const char* text : {"500m", "1.5", "1001m", "1.0001", "-1", "1n", "lots", ""}) {
    auto n = parse_count(text);
    ASSERT_FALSE(n) << text << " counted as " << *n;
    EXPECT_NE(n.error().message.find(std::string("'") + text + "'"), std::string::npos)
        << n.error().message;
  }
}
