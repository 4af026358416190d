// libFuzzer target: Kubernetes resource quantities (kube/quantity.hpp, ParseQuantity's grammar).
// Input: the quantity text, as bytes. Oracles: a parsed value is in range and its formatted
// form parses back equal; a count is the value rounded up; and for a plain number N the suffix
// tables agree with the exponent form (N + "k" == N + "e3", ..., N + "Ki" == N * 1024).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kube/quantity.hpp"

using namespace gpufence;

namespace {

bool plain_number(std::string_view s, size_t& fraction_digits) {
  size_t i = 0, digits = 0;
  fraction_digits = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  bool point = false;
  for (; i < s.size(); ++i) {
    if (s[i] >= '0' && s[i] <= '9') {
      ++digits;
      if (point) ++fraction_digits;
    } else if (s[i] == '.' && !point) {
      point = true;
    } else {
      return false;
    }
  }
  return digits > 0;
}

void check_suffix_tables(std::string_view text, const Quantity& plain, size_t fraction_digits) {
  static const std::pair<const char*, const char*> decimal[] = {
      {"n", "e-9"}, {"u", "e-6"}, {"m", "e-3"}, {"k", "e3"}, {"M", "e6"},
      {"G", "e9"},  {"T", "e12"}, {"P", "e15"}, {"E", "e18"}};
  for (const auto& [si, exponent] : decimal) {
    auto a = parse_quantity(std::string(text) + si);
    auto b = parse_quantity(std::string(text) + exponent);
    if (!a || !b || !(*a == *b)) std::abort();
  }
  // Binary suffixes multiply exactly when the number itself was exact (at most 9 decimals).
  if (fraction_digits > 9) return;
  static const std::pair<const char*, int> binary[] = {{"Ki", 10}, {"Mi", 20}, {"Gi", 30},
                                                       {"Ti", 40}, {"Pi", 50}, {"Ei", 60}};
  for (const auto& [si, shift] : binary) {
    auto a = parse_quantity(std::string(text) + si);
    if (!a) std::abort();
    Quantity want = plain;
    want.nanos = plain.nanos > (kQuantityMaxNanos >> shift)
                     ? kQuantityMaxNanos
                     : std::min(kQuantityMaxNanos, plain.nanos << shift);
    if (!(*a == want)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto q = parse_quantity(text);
  if (!q) return 0;
  if (q->nanos > kQuantityMaxNanos) std::abort();
  if (q->negative && q->nanos == 0) std::abort();
  auto again = parse_quantity(format_quantity(*q));
  if (!again || !(*again == *q)) std::abort();
  if (auto n = quantity_count(*q)) {
    constexpr QuantityNanos kNano = 1000000000u;
    if (*n < 0 || static_cast<QuantityNanos>(*n) != q->nanos / kNano + (q->nanos % kNano != 0))
      std::abort();
  } else if (!q->negative && q->nanos % 1000000000u == 0) {
    std::abort();  // a whole, non-negative value is always a count
  }
  size_t fraction_digits = 0;
  if (size <= 64 && plain_number(text, fraction_digits))
    check_suffix_tables(text, *q, fraction_digits);
  return 0;
}
