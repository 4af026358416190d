// A finding: one place where configuration or reality is wrong, with the evidence and the exact
// fix. Produced by pure checks (containerd config, the node doctor) and rendered by their callers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpufence {

enum class Severity { info, warning, error };

inline std::string_view severity_name(Severity s) {
  switch (s) {
    case Severity::info:
      return "info";
    case Severity::warning:
      return "warning";
    case Severity::error:
      return "error";
  }
  return "info";
}

struct Finding {
  std::string id;  // stable, e.g. "containerd.handler-missing"
  Severity severity = Severity::error;
  std::string summary;   // one line
  std::string evidence;  // what was read, and where
  std::string fix;       // the exact change to make
  // The pod it is about, "namespace/name" as containerd created it; "" = the node. Where an
  // Event about the finding goes (`gpufence doctor --report-node`); not in the text or JSON.
  std::string pod = "";
};

// One finding as the text reports print it (the doctor's, check-containerd's), every field escaped
// (common/escape.hpp: a config value or a pod's bytes are data, never terminal control):
//   - [id] summary
//       evidence: ...
//       fix:      ...
std::string finding_text(const Finding& f);
// Every finding, grouped under "ERRORS:", "WARNINGS:", "INFO:" (each group followed by a blank
// line); "" for none.
std::string findings_text(const std::vector<Finding>& findings);

// One finding as the JSON reports hold it (the doctor's `findings`, check-containerd's), the keys
// in this order: {id, severity, summary, evidence, fix} (docs/doctor.md). The fields are kept as
// they are; report_json_text makes them printable.
nlohmann::ordered_json finding_json(const Finding& f);
nlohmann::ordered_json findings_json(const std::vector<Finding>& findings);
// A JSON report as printed, with a final newline: indented, ASCII only, and bytes that are not
// UTF-8 replaced by U+FFFD. A pod's env value, a RuntimeClass's handler name are any bytes, and
// nlohmann's default dump throws on those (docs/trust-model.md, "Files a pod controls").
std::string report_json_text(const nlohmann::ordered_json& doc);

inline bool has_errors(const std::vector<Finding>& findings) {
  for (const auto& f : findings) {
    if (f.severity == Severity::error) return true;
  }
  return false;
}

}  // namespace gpufence
