// The doctor's findings as Prometheus metrics (docs/monitoring.md): what each container can open
// against what the kubelet allocated it, the findings by id, gpufence-nri's state and the
// doctor's own runs. Printed by `gpufence doctor --metrics`, served by `--serve`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "doctor/snapshot.hpp"

namespace gpufence {

// The doctor's runs so far (one for a one-shot doctor).
struct DoctorRuns {
  std::uint64_t runs = 1;
  std::chrono::system_clock::time_point last_run{};
  std::chrono::duration<double> last_duration{};
};

std::string render_doctor_metrics(const Snapshot& s, const std::vector<Finding>& findings,
                                  const DoctorRuns& runs);

}  // namespace gpufence
