#include "kube/quantity.hpp"

#include <algorithm>
#include <optional>

#include "common/strings.hpp"

namespace gpufence {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// parseQuantityString's pieces (quantity.go): the sign, the numeric text (`value`, what the slow
// path hands to inf.Dec), numerator without leading zeros, denominator, and suffix.
struct Pieces {
  bool positive = true;
  std::string_view value, num, denom, suffix;
};

Result<Pieces> split_quantity(std::string_view s) {
  Pieces p;
  size_t pos = 0;
  const size_t end = s.size();
  if (pos < end && (s[0] == '-' || s[0] == '+')) {
    p.positive = s[0] != '-';
    ++pos;
  }
  while (pos < end && s[pos] == '0') ++pos;  // leading zeros
  if (pos >= end) {
    p.num = p.value = "0";
    return p;
  }
  size_t i = pos;
  while (i < end && is_digit(s[i])) ++i;
  if (i >= end) {
    p.num = s.substr(pos);
    p.value = s;
    return p;
  }
  p.num = s.substr(pos, i - pos);
  pos = i;
  if (p.num.empty()) p.num = "0";  // "all numerator positions stripped": 0
  if (pos < end && s[pos] == '.') {
    ++pos;
    i = pos;
    while (i < end && is_digit(s[i])) ++i;
    p.denom = s.substr(pos, i - pos);
    if (i >= end) {
      p.value = s;
      return p;
    }
    pos = i;  // upstream accepts "1.G" (an empty fraction)
  }
  p.value = s.substr(0, pos);
  const size_t suffix_start = pos;
  static constexpr std::string_view kSuffixLetters = "eEinumkKMGTP";
  i = pos;
  while (i < end && kSuffixLetters.find(s[i]) != std::string_view::npos) ++i;
  if (i < end) {
    pos = i;
    if (s[pos] == '-' || s[pos] == '+') ++pos;
    i = pos;
    while (i < end && is_digit(s[i])) ++i;
    if (i < end)
      return fail(Errc::parse, "quantity '", s,
                  "': must match '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'");
  }
  p.suffix = s.substr(suffix_start);
  return p;
}

enum class Base { ten, two };
struct Suffix {
  Base base;
  int32_t exponent;
};

// suffixHandler.interpret (suffix.go): the decimal table, the binary table, then e/E with an
// integer (strconv.ParseInt base 10, 64 bits: an optional sign and digits), truncated to int32.
std::optional<Suffix> interpret_suffix(std::string_view s) {
  static const std::pair<std::string_view, int32_t> decimal[] = {
      {"n", -9}, {"u", -6}, {"m", -3}, {"", 0},   {"k", 3},
      {"M", 6},  {"G", 9},  {"T", 12}, {"P", 15}, {"E", 18}};
  static const std::pair<std::string_view, int32_t> binary[] = {{"Ki", 10}, {"Mi", 20}, {"Gi", 30},
                                                                {"Ti", 40}, {"Pi", 50}, {"Ei", 60}};
  for (const auto& [name, e] : decimal)
    if (s == name) return Suffix{Base::ten, e};
  for (const auto& [name, e] : binary)
    if (s == name) return Suffix{Base::two, e};
  if (s.size() > 1 && (s[0] == 'e' || s[0] == 'E')) {
    std::string_view digits = s.substr(1);
    bool negative = false;
    if (digits[0] == '+' || digits[0] == '-') {
      negative = digits[0] == '-';
      digits.remove_prefix(1);
    }
    auto magnitude = parse_number<uint64_t>(digits);
    if (!magnitude) return std::nullopt;
    if (*magnitude > (negative ? uint64_t{1} << 63 : uint64_t{INT64_MAX})) return std::nullopt;
    // Go's int32(parsed): the low 32 bits, two's complement (a negation modulo 2^64 first).
    uint64_t bits = negative ? ~*magnitude + 1 : *magnitude;
    return Suffix{Base::ten, static_cast<int32_t>(static_cast<uint32_t>(bits))};
  }
  return std::nullopt;
}

// Decimal digits times 2^shift (shift <= 60), as decimal digits.
std::string times_power_of_two(std::string_view digits, int shift) {
  std::string out(digits);
  QuantityNanos carry = 0;
  for (size_t i = out.size(); i-- > 0;) {
    QuantityNanos v = (static_cast<QuantityNanos>(out[i] - '0') << shift) + carry;
    out[i] = static_cast<char>('0' + static_cast<int>(v % 10));
    carry = v / 10;
  }
  std::string head;
  while (carry > 0) {
    head.push_back(static_cast<char>('0' + static_cast<int>(carry % 10)));
    carry /= 10;
  }
  std::reverse(head.begin(), head.end());
  return head + out;
}

QuantityNanos digits_value(std::string_view digits) {  // at most 29 digits: fits
  QuantityNanos v = 0;
  for (char c : digits) v = v * 10 + static_cast<QuantityNanos>(c - '0');
  return v;
}

// ceil(digits * 10^exp10) in nanos, clamped at kQuantityMaxNanos.
QuantityNanos scaled_nanos(std::string_view digits, int64_t exp10) {
  digits.remove_prefix(std::min(digits.size(), digits.find_first_not_of('0')));
  if (digits.empty()) return 0;
  constexpr int64_t kMaxDigits = 29;  // kQuantityMaxNanos has 28
  if (exp10 >= 0) {
    if (static_cast<int64_t>(digits.size()) + exp10 > kMaxDigits) return kQuantityMaxNanos;
    QuantityNanos v = digits_value(digits);
    for (int64_t i = 0; i < exp10; ++i) v *= 10;
    return std::min(v, kQuantityMaxNanos);
  }
  const uint64_t drop = static_cast<uint64_t>(-exp10);
  if (drop >= digits.size()) return 1;  // below 1n, not zero: rounds up to 1n
  std::string_view whole = digits.substr(0, digits.size() - drop);
  std::string_view rest = digits.substr(digits.size() - drop);
  if (static_cast<int64_t>(whole.size()) > kMaxDigits) return kQuantityMaxNanos;
  QuantityNanos v = digits_value(whole);
  if (rest.find_first_not_of('0') != std::string_view::npos) ++v;  // inf.RoundUp to 1n
  return std::min(v, kQuantityMaxNanos);
}

std::string u128_text(QuantityNanos v) {
  std::string out;
  do {
    out.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v > 0);
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

Result<Quantity> parse_quantity(std::string_view text) {
  if (text.empty()) return fail(Errc::parse, "quantity '': empty");
  auto pieces = split_quantity(text);
  if (!pieces) return std::unexpected(pieces.error());
  auto suffix = interpret_suffix(pieces->suffix);
  if (!suffix)
    return fail(Errc::parse, "quantity '", text, "': unable to parse the suffix '", pieces->suffix,
                "'");
  // Upstream's slow path (inf.Dec.SetString of `value`) needs a digit; its fast path does not.
  // A value without digits is 0 and takes the slow path only for an exponent below -9 (decimal:
  // the fast path needs scale >= Nano) or a binary suffix of Pi or Ei (its precision estimate,
  // 15 - 1 - exponent*3/10 - 1, goes negative).
  if (pieces->value.find_first_of("0123456789") == std::string_view::npos) {
    bool slow = suffix->base == Base::ten ? suffix->exponent < -9 : suffix->exponent >= 50;
    if (slow) return fail(Errc::parse, "quantity '", text, "': unable to parse the numeric part");
    return Quantity{};
  }
  std::string digits = std::string(pieces->num) + std::string(pieces->denom);
  int64_t exp10 = 9 - static_cast<int64_t>(pieces->denom.size());
  if (suffix->base == Base::ten)
    exp10 += suffix->exponent;
  else
    digits = times_power_of_two(digits, suffix->exponent);
  Quantity q;
  q.nanos = scaled_nanos(digits, exp10);
  q.negative = !pieces->positive && q.nanos != 0;
  return q;
}

std::string format_quantity(const Quantity& q) {
  constexpr QuantityNanos kNano = 1000000000u;
  std::string out = (q.negative ? "-" : "") + u128_text(q.nanos / kNano);
  QuantityNanos frac = q.nanos % kNano;
  if (frac != 0) {
    std::string f = u128_text(frac);
    f.insert(0, 9 - f.size(), '0');
    f.erase(f.find_last_not_of('0') + 1);
    out += "." + f;
  }
  return out;
}

Result<long> quantity_count(const Quantity& q) {
  if (q.negative)
    return fail(Errc::invalid_argument, "'", format_quantity(q),
                "' is negative (the API admits no negative resource quantity)");
  constexpr QuantityNanos kMicro = 1000000u, kNano = 1000000000u;
  QuantityNanos milli = q.nanos / kMicro + (q.nanos % kMicro != 0 ? 1 : 0);
  if (milli % 1000 != 0)
    return fail(Errc::invalid_argument, "'", format_quantity(q),
                "' is not a whole number (the API admits only integers for extended resources)");
  return static_cast<long>(q.nanos / kNano + (q.nanos % kNano != 0 ? 1 : 0));
}

Result<long> parse_count(std::string_view text) {
  auto q = parse_quantity(text);
  if (!q) return std::unexpected(q.error());
  auto n = quantity_count(*q);
  if (!n) return fail(Errc::invalid_argument, "quantity '", text, "': ", n.error().message);
  return n;
}

Result<long> resource_count(const nlohmann::json& list, const std::string& key) {
  if (!list.is_object() || !list.contains(key)) return 0L;
  const auto& v = list[key];
  if (v.is_number_unsigned())
    return static_cast<long>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
  if (v.is_number_integer()) {
    if (v.get<long>() < 0) return fail(Errc::invalid_argument, key, ": ", v.dump(), " is negative");
    return v.get<long>();
  }
  if (v.is_string()) {
    auto n = parse_count(v.get<std::string>());
    if (!n) return fail(Errc::parse, key, ": ", n.error().message);
    return n;
  }
  return fail(Errc::parse, key, ": ", v.dump(), " is not a quantity");
}

}  // namespace gpufence
