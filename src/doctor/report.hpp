// The doctor's report: text grouped by severity with a line per container, and JSON
// (schema "gpufence.doctor/v1", docs/doctor.md), printed by report_json_text (common/finding.hpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "doctor/snapshot.hpp"

namespace gpufence {

std::string render_doctor_text(const Snapshot& s, const std::vector<Finding>& findings);
nlohmann::ordered_json render_doctor_json(const Snapshot& s, const std::vector<Finding>& findings);
// 0 clean (warnings allowed), 1 findings of error severity.
int doctor_exit_code(const std::vector<Finding>& findings);

}  // namespace gpufence
