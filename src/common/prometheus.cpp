#include "common/prometheus.hpp"

#include <charconv>
#include <cmath>

#include "common/escape.hpp"

namespace gpufence {

std::string prom_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest form that reads back the same; fixed notation where it is short ("0.0005",
  // "1796193335.77", as Go's client writes them), else scientific.
  char buf[400];
  double magnitude = std::fabs(value);
  auto format = magnitude == 0 || (magnitude >= 1e-4 && magnitude < 1e15)
                    ? std::chars_format::fixed
                    : std::chars_format::general;
  auto end = std::to_chars(buf, buf + sizeof buf, value, format).ptr;
  return std::string(buf, end);
}

std::string prom_label_value(std::string_view value) {
  std::string shown = escape_excerpt(value, kMaxLabelValueBytes);
  std::string out;
  out.reserve(shown.size());
  for (char c : shown) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void PromText::family(std::string_view name, std::string_view type, std::string_view help) {
  m_out += "# HELP ";
  m_out += name;
  m_out += ' ';
  m_out += help;
  m_out += "\n# TYPE ";
  m_out += name;
  m_out += ' ';
  m_out += type;
  m_out += '\n';
}

void PromText::labels(const PromLabels& labels) {
  if (labels.empty()) return;
  m_out += '{';
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) m_out += ',';
    first = false;
    m_out += key;
    m_out += "=\"";
    m_out += prom_label_value(value);
    m_out += '"';
  }
  m_out += '}';
}

void PromText::sample(std::string_view name, const PromLabels& l, double value) {
  m_out += name;
  labels(l);
  m_out += ' ';
  m_out += prom_number(value);
  m_out += '\n';
}

void PromText::sample(std::string_view name, const PromLabels& l, std::uint64_t value) {
  m_out += name;
  labels(l);
  m_out += ' ';
  m_out += std::to_string(value);
  m_out += '\n';
}

}  // namespace gpufence
