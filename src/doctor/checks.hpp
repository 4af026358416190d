// The doctor's judge: pure functions from a Snapshot to findings. Every check has a stable id.
#pragma once

#include <vector>

#include "doctor/snapshot.hpp"

namespace gpufence {

// The GPUs (by minor) the kubelet allocated to a container; nullopt when allocations are
// unknown or the container is not found in them.
std::optional<std::set<unsigned>> allocated_minors(const Snapshot& s, const NodeContainer& c);

std::vector<Finding> judge(const Snapshot& snapshot);

// Ids of every check, for the report's schema documentation and tests.
const std::vector<std::string>& doctor_check_ids();

}  // namespace gpufence
