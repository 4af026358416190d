// Kubernetes resource quantities ("2", "1k", "1e3", "500m", "1Gi") read as the API server reads
// them: k8s.io/apimachinery pkg/api/resource/quantity.go ParseQuantity (docs/autoscale.md,
// "Quantities"). The one definition in gpufence: every capacity, allocatable, request and limit
// goes through here, and what it cannot read is an error, never 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace gpufence {

__extension__ using QuantityNanos = unsigned __int128;

// The largest magnitude kept, in whole units: INT64_MAX, ParseQuantity's own cap (maxAllowed).
// Larger values clamp to it (upstream caps BinarySI there and keeps decimal values exact; every
// count gpufence takes from a quantity is an int64 anyway).
inline constexpr QuantityNanos kQuantityMaxNanos =
    static_cast<QuantityNanos>(INT64_MAX) * 1000000000u;

// A parsed value: its sign and its magnitude in nano units. ParseQuantity rounds every non-zero
// value up (away from zero) to a multiple of 1n, so this is exact for everything it returns.
struct Quantity {
  bool negative = false;  // never set for 0
  QuantityNanos nanos = 0;
  friend bool operator==(const Quantity&, const Quantity&) = default;
};

// ParseQuantity's grammar and value: an optional sign, digits with an optional fraction, then a
// decimal SI suffix (n u m "" k M G T P E), a binary one (Ki Mi Gi Ti Pi Ei) or a decimal
// exponent (e/E and a signed integer, taken as int32 as upstream does). Errors carry upstream's
// three kinds: the format, the suffix, the numeric part.
Result<Quantity> parse_quantity(std::string_view text);

// A plain decimal ("-12.5", "0.000000001") that parse_quantity reads back equal.
std::string format_quantity(const Quantity& q);

// A count of an integer resource (an extended resource such as nvidia.com/gpu) from a
// quantity: what the API admits for it (ValidateResourceQuantityValue: not negative, and
// MilliValue() % 1000 == 0, so "1000m" is 1 and "500m" is refused), counted as the scheduler and
// the kubelet's device manager count it (Quantity.Value(): rounded up to a whole number).
Result<long> quantity_count(const Quantity& q);
Result<long> parse_count(std::string_view text);

// `list[key]` of a ResourceList (capacity, allocatable, requests, limits, overhead) as a count:
// 0 when absent; a string through parse_count; a JSON integer as itself (not negative). Anything
// else is an error naming the key and the value.
Result<long> resource_count(const nlohmann::json& list, const std::string& key);

}  // namespace gpufence
