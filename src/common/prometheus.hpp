// Prometheus' text exposition format (version 0.0.4), written once for every /metrics of
// gpufence's: families with HELP and TYPE, samples with labels. A label value may carry bytes a
// pod chose (a container name, a path): it is escaped once for display (escape_text: controls and
// bytes that are not UTF-8 become \xNN), bounded, then encoded as the format requires (a backslash,
// a double quote and a newline escaped), so no value ends its label or its line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpufence {

// The most bytes of one label value (after escaping; longer is cut and its length named).
inline constexpr size_t kMaxLabelValueBytes = 256;

using PromLabels = std::vector<std::pair<std::string_view, std::string>>;

// A number as the format writes it: the shortest form that reads back the same ("0.00025").
std::string prom_number(double value);

// A label value as it appears between the quotes.
std::string prom_label_value(std::string_view value);

class PromText {
 public:
  // Starts a family: "# HELP name help" and "# TYPE name type" (gauge, counter, histogram).
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const PromLabels& labels, double value);
  void sample(std::string_view name, const PromLabels& labels, std::uint64_t value);
  const std::string& text() const { return m_out; }
  std::string take() { return std::move(m_out); }

 private:
  void labels(const PromLabels& labels);
  std::string m_out;
};

}  // namespace gpufence
