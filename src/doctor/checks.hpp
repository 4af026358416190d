// The doctor's judge: pure functions from a Snapshot to findings. Every check has a stable id.
#pragma once

#include <string_view>
#include <vector>

#include "doctor/snapshot.hpp"

namespace gpufence {

// The GPUs (by minor) the kubelet allocated to a container; nullopt when allocations are
// unknown or the container is not found in them.
std::optional<std::set<unsigned>> allocated_minors(const Snapshot& s, const NodeContainer& c);
// Whether the kubelet's PodResources names this container (its List names every container of
// every pod it runs; docs/deviceplugin.md, "PodResources"). False when allocations are unknown.
bool in_kubelet_view(const Snapshot& s, const NodeContainer& c);
// Whether the container is gpufence's own (its device plugin, DRA driver, installer, doctor):
// the namespace containerd created it in is the install's and the API server shows its pod
// controlled by one of the chart's DaemonSets. How that was told, or nullopt.
std::optional<std::string> own_pod(const Snapshot& s, const NodeContainer& c);

// One check: the id every finding it emits carries ("containerd.*": a family) and the function.
struct DoctorCheck {
  std::string_view id;
  void (*run)(const Snapshot&, std::vector<Finding>&);
};

// The doctor's checks in the order they run; judge() is every one of them, errors first.
const std::vector<DoctorCheck>& doctor_checks();
std::vector<Finding> judge(const Snapshot& snapshot);

// Ids of every check, taken from doctor_checks(), for the report's schema and tests.
const std::vector<std::string>& doctor_check_ids();
// Whether a finding id belongs to a check's id ("containerd.*" covers containerd.<anything>).
bool check_id_matches(std::string_view entry, std::string_view id);

}  // namespace gpufence
