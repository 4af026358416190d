#include "doctor/report.hpp"

#include "common/escape.hpp"
#include "common/strings.hpp"
#include "doctor/checks.hpp"
#include "doctor/parse.hpp"

namespace gpufence {
namespace {

std::string minors_text(const Snapshot& s, const std::set<unsigned>& minors) {
  std::vector<std::string> out;
  for (unsigned m : minors) {
    std::string name = cat("nvidia", m);
    for (const auto& g : s.gpus) {
      if (g.gpu.minor == m) name = cat("GPU", g.gpu.index);
    }
    out.push_back(name);
  }
  return out.empty() ? "-" : join(out, ",");
}

std::set<unsigned> used(const Snapshot& s, const NodeContainer& c) {
  std::set<unsigned> out;
  for (const auto& g : s.gpus) {
    for (const auto& p : g.processes) {
      if (std::find(c.pids.begin(), c.pids.end(), p.pid) != c.pids.end()) out.insert(g.gpu.minor);
    }
  }
  return out;
}

// One report field as one printable line (the product's one escaping, common/escape.hpp): what a
// pod controls (its env, a pod spec's values) reaches the text report as data.
std::string printable(std::string_view in) {
  return escape_text(in);
}

// The "can open" column: what the devices rules say, and whether anyone opened to see.
std::string openable_text(const Snapshot& s, const NodeContainer& c) {
  std::string out = c.openable ? minors_text(s, *c.openable) : std::string("?");
  if (c.openable && c.openable_observed())
    out += " (probe)";
  else if (c.openable)
    out += cat(" (", c.openable_source, ", unverified)");
  if (!c.left_cgroup.empty()) out += " [processes outside this cgroup]";
  return out;
}

nlohmann::ordered_json minors_json(const std::set<unsigned>& m) {
  auto arr = nlohmann::ordered_json::array();
  for (unsigned x : m) arr.push_back(x);
  return arr;
}

}  // namespace

std::string render_doctor_text(const Snapshot& s, const std::vector<Finding>& findings) {
  std::string out;
  out += cat("gpufence doctor: ", s.gpus.size(), " GPU(s), ", s.containers.size(),
             " container(s)\n\n");
  out += "Containers (allocated by the kubelet / can open / used by processes):\n";
  bool unverified = false;
  for (const auto& c : s.containers) unverified |= c.openable && !c.openable_observed();
  if (s.containers.empty()) out += "  none found\n";
  for (const auto& c : s.containers) {
    auto alloc = allocated_minors(s, c);
    out += cat("  ", printable(c.label()), c.has_cap_sys_admin ? " [privileged]" : "",
               c.host_pid.value_or(false) ? " [hostPID]" : "", ": allocated ",
               alloc ? minors_text(s, *alloc) : std::string("?"), " | can open ",
               openable_text(s, c), " | uses ", minors_text(s, used(s, c)), "\n");
  }
  if (unverified) {
    // The rules say what the cgroup should allow; a process that left the cgroup, or a kernel
    // that applies them otherwise, is seen only by opening (docs/trust-model.md, "What the
    // doctor observes").
    out += cat("  (unverified: read from the devices rules, not observed",
               s.probed ? "; the probe could not run for these" : "; --probe opens each GPU node",
               ")\n");
  }
  out += "\n";
  out += findings_text(findings);
  if (findings.empty()) {
    out += unverified ? "No problems found: allocation and the devices rules agree (not observed: "
                        "`gpufence doctor --probe` opens them).\n\n"
                      : "No problems found: allocation and reality agree.\n\n";
  }
  if (!s.skipped.empty()) {
    out += "Skipped:\n";
    for (const auto& sk : s.skipped) out += "- " + printable(sk) + "\n";
  }
  return out;
}

nlohmann::ordered_json render_doctor_json(const Snapshot& s, const std::vector<Finding>& findings) {
  nlohmann::ordered_json doc;
  doc["schema"] = "gpufence.doctor/v1";
  doc["gpus"] = nlohmann::ordered_json::array();
  for (const auto& g : s.gpus) {
    nlohmann::ordered_json pids = nlohmann::ordered_json::array();
    for (const auto& p : g.processes) pids.push_back(p.pid);
    doc["gpus"].push_back(
        {{"index", g.gpu.index}, {"uuid", g.gpu.uuid}, {"minor", g.gpu.minor}, {"pids", pids}});
  }
  doc["containers"] = nlohmann::ordered_json::array();
  for (const auto& c : s.containers) {
    auto alloc = allocated_minors(s, c);
    nlohmann::ordered_json j;
    j["id"] = c.id;
    j["namespace"] = c.pod_namespace;
    j["pod"] = c.pod;
    j["container"] = c.name;
    j["privileged"] = c.has_cap_sys_admin;  // key kept: doctor --json is an interface
    j["pids"] = c.pids;
    j["allocated_minors"] = alloc ? minors_json(*alloc) : nlohmann::ordered_json();
    j["openable_minors"] = c.openable ? minors_json(*c.openable) : nlohmann::ordered_json();
    j["openable_source"] = c.openable_source;
    // Added beside openable_source: true only when the probe opened the nodes; false when the
    // minors come from devices rules (what the cgroup should allow, not observed).
    j["openable_verified"] = c.openable_observed();
    j["left_devices_cgroup"] = c.left_cgroup;
    j["host_pid"] = c.host_pid ? nlohmann::ordered_json(*c.host_pid) : nullptr;
    j["cap_sys_ptrace"] =
        c.cap_eff || c.cap_bnd
            ? nlohmann::ordered_json(
                  (((c.cap_eff.value_or(0) | c.cap_bnd.value_or(0)) >> kCapSysPtrace) & 1) != 0)
            : nullptr;
    j["writable_sysfs"] = c.writable_sysfs;
    j["nodes_present_minors"] = minors_json(c.gpu_nodes_present);
    j["used_minors"] = minors_json(used(s, c));
    j["nvidia_visible_devices"] =
        c.nvidia_visible_devices ? nlohmann::ordered_json(*c.nvidia_visible_devices) : nullptr;
    j["cuda_visible_devices"] =
        c.cuda_visible_devices ? nlohmann::ordered_json(*c.cuda_visible_devices) : nullptr;
    doc["containers"].push_back(j);
  }
  doc["findings"] = findings_json(findings);
  doc["skipped"] = s.skipped;
  return doc;
}

int doctor_exit_code(const std::vector<Finding>& findings) {
  return has_errors(findings) ? 1 : 0;
}

}  // namespace gpufence
