// What gpufence-nri tells the doctor, in a file of its own (runtime.toml [nri] status_file, default
// /var/lib/gpufence/nri-status.json): whether it is connected to containerd, and which containers
// containerd created without it — found at each Synchronize, where containerd lists every
// container it has (docs/nri.md, "Status: connected, and what was created while it was down").
// The one definition of the file's format: the plugin writes it, the doctor reads it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace gpufence::nri {

// The annotation every container gpufence-nri decided carries, its value the container's id (set
// by its adjustment, so it is in the spec containerd keeps and shows again at Synchronize, and
// checked by the fence). A pod cannot forge it: it cannot know the id containerd generates.
inline constexpr std::string_view kDecidedAnnotation = "gpufence.io/nri-decided";

enum class NriState { connected, waiting, exited };
std::string_view nri_state_name(NriState s);

// A container that exists with no decision of gpufence-nri's and that the decision would change
// as far as GPUs go (grant, deny, narrow, refuse): created while the plugin was down.
struct UnenforcedContainer {
  std::string id;
  std::string pod;  // namespace/name
  std::string name;
  std::string runtime_handler;  // the pod's CRI handler ("" = containerd's default)
  std::string why;              // what the decision would have done
  bool operator==(const UnenforcedContainer&) const = default;
};

// What gpufence-nri decided since it started: CreateContainer answers by outcome, refusals by
// cause, and how long each decision took (a histogram; the doctor serves these as metrics,
// docs/monitoring.md). Counted in memory and written with the status, at most every few seconds.
struct NriDecisionCounters {
  // Upper bounds of the decision time histogram, seconds.
  static constexpr std::array<double, 9> kBuckets = {0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01,    0.025,  0.1,   1.0};
  std::map<std::string, uint64_t> outcomes;  // granted, no_gpu, node_agent, refused
  std::map<std::string, uint64_t> refusals;  // denied (policy, budget), invalid (limits), error
  std::array<uint64_t, kBuckets.size()> buckets{};
  uint64_t count = 0;
  double sum_seconds = 0;
  void observe(std::string_view outcome, std::string_view refusal, double seconds);
  bool operator==(const NriDecisionCounters&) const = default;
};

struct NriStatus {
  int64_t pid = 0;
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat: tells a reused pid from this process
  NriState state = NriState::waiting;
  std::string since;  // UTC, when the state was entered
  std::string socket;
  std::string runtime, runtime_version, nri_version;
  bool device_rules = false;     // the runtime applies device cgroup adjustments (NRI >= v0.10)
  std::string synchronized_at;   // UTC of the last Synchronize judged; "" = none yet
  int64_t containers = 0;        // containers containerd listed then
  int64_t without_gpu_edit = 0;  // created without it, but the decision changes no GPU access
  std::vector<UnenforcedContainer> unenforced;
  // The list is from an earlier connection's Synchronize: the current one's judgement has not
  // finished yet (reconnects never empty the list; docs/nri.md).
  bool judgement_stale = false;
  NriDecisionCounters decisions;
  bool operator==(const NriStatus&) const = default;
};

std::string render_nri_status(const NriStatus& s);
Result<NriStatus> parse_nri_status(std::string_view text, std::string_view origin);

// Field 22 (starttime, clock ticks since boot) of a /proc/<pid>/stat line; the command name in
// field 2 may hold spaces and parentheses, so fields are counted after its last ')'.
Result<uint64_t> parse_proc_start_time(std::string_view stat_line);

// Replaces the status file atomically (temp file + rename) in a directory no component of whose
// path may be a symbolic link, its last directory made 0700 when missing (docs/nri.md).
Status write_nri_status(const std::string& path, const NriStatus& s);

// "2026-12-02T03:50:00Z" for now: the status file's stamps are whole seconds.
std::string utc_now_text();

}  // namespace gpufence::nri
