#include "common/finding.hpp"

#include "common/escape.hpp"

namespace gpufence {

std::string finding_text(const Finding& f) {
  return "- [" + escape_text(f.id) + "] " + escape_text(f.summary) +
         "\n    evidence: " + escape_text(f.evidence) + "\n    fix:      " + escape_text(f.fix) +
         "\n";
}

std::string findings_text(const std::vector<Finding>& findings) {
  std::string out;
  for (Severity sev : {Severity::error, Severity::warning, Severity::info}) {
    bool header = false;
    for (const auto& f : findings) {
      if (f.severity != sev) continue;
      if (!header) {
        out += sev == Severity::error     ? "ERRORS:\n"
               : sev == Severity::warning ? "WARNINGS:\n"
                                          : "INFO:\n";
        header = true;
      }
      out += finding_text(f);
    }
    if (header) out += "\n";
  }
  return out;
}

nlohmann::ordered_json finding_json(const Finding& f) {
  return {{"id", f.id},
          {"severity", severity_name(f.severity)},
          {"summary", f.summary},
          {"evidence", f.evidence},
          {"fix", f.fix}};
}

nlohmann::ordered_json findings_json(const std::vector<Finding>& findings) {
  auto arr = nlohmann::ordered_json::array();
  for (const auto& f : findings) arr.push_back(finding_json(f));
  return arr;
}

std::string report_json_text(const nlohmann::ordered_json& doc) {
  return doc.dump(2, ' ', true, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace gpufence
