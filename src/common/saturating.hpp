// Saturating integer arithmetic for counts that come from API objects (GPU requests, stream
// counts, replicas): a value a tenant or a bad config sets to INT64_MAX must clamp, never wrap
// (signed overflow is undefined behaviour, and a wrapped sum turns demand into free capacity).
#pragma once

#include <cstdint>
#include <limits>

namespace gpufence {

inline long sat_add(long a, long b) {
  long r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<long>::max() : std::numeric_limits<long>::min();
}

inline long sat_sub(long a, long b) {
  long r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<long>::max() : std::numeric_limits<long>::min();
}

inline long sat_mul(long a, long b) {
  long r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<long>::min() : std::numeric_limits<long>::max();
}

// ceil(a / b) for a >= 0, b > 0, without the a + b - 1 that overflows.
inline long ceil_div(long a, long b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace gpufence
