// A finding: one place where configuration or reality is wrong, with the evidence and the exact
// fix. Produced by pure checks (containerd config, the node doctor) and rendered by their callers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

inline bool has_errors(const std::vector<Finding>& findings) {
  for (const auto& f : findings) {
    if (f.severity == Severity::error) return true;
  }
  return false;
}

}  // namespace gpufence
