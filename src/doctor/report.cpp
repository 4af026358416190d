#include "doctor/report.hpp"

#include "common/escape.hpp"
#include "common/strings.hpp"
#include "doctor/checks.hpp"

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
  if (s.containers.empty()) out += "  none found\n";
  for (const auto& c : s.containers) {
    auto alloc = allocated_minors(s, c);
    out += cat("  ", printable(c.label()), c.privileged ? " [privileged]" : "", ": allocated ",
               alloc ? minors_text(s, *alloc) : std::string("?"), " | can open ",
               c.openable ? minors_text(s, *c.openable) + " (" + c.openable_source + ")"
                          : std::string("?"),
               " | uses ", minors_text(s, used(s, c)), "\n");
  }
  out += "\n";
  for (Severity sev : {Severity::error, Severity::warning, Severity::info}) {
    bool header = false;
    for (const auto& f : findings) {
      if (f.severity != sev) continue;
      if (!header) {
        out += cat(sev == Severity::error     ? "ERRORS"
                   : sev == Severity::warning ? "WARNINGS"
                                              : "INFO",
                   ":\n");
        header = true;
      }
      out += cat("- [", printable(f.id), "] ", printable(f.summary),
                 "\n    evidence: ", printable(f.evidence), "\n    fix:      ", printable(f.fix),
                 "\n");
    }
    if (header) out += "\n";
  }
  if (findings.empty()) out += "No problems found: allocation and reality agree.\n\n";
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
    j["privileged"] = c.privileged;
    j["pids"] = c.pids;
    j["allocated_minors"] = alloc ? minors_json(*alloc) : nlohmann::ordered_json();
    j["openable_minors"] = c.openable ? minors_json(*c.openable) : nlohmann::ordered_json();
    j["openable_source"] = c.openable_source;
    j["nodes_present_minors"] = minors_json(c.gpu_nodes_present);
    j["used_minors"] = minors_json(used(s, c));
    j["nvidia_visible_devices"] =
        c.nvidia_visible_devices ? nlohmann::ordered_json(*c.nvidia_visible_devices) : nullptr;
    j["cuda_visible_devices"] =
        c.cuda_visible_devices ? nlohmann::ordered_json(*c.cuda_visible_devices) : nullptr;
    doc["containers"].push_back(j);
  }
  doc["findings"] = nlohmann::ordered_json::array();
  for (const auto& f : findings) {
    doc["findings"].push_back({{"id", f.id},
                               {"severity", severity_name(f.severity)},
                               {"summary", f.summary},
                               {"evidence", f.evidence},
                               {"fix", f.fix}});
  }
  doc["skipped"] = s.skipped;
  return doc;
}

std::string doctor_json_text(const nlohmann::ordered_json& doc) {
  // ASCII only, with bytes that are not UTF-8 replaced by U+FFFD: a pod's env value is any bytes,
  // and the default dump throws on those (docs/trust-model.md, "Files a pod controls").
  return doc.dump(2, ' ', true, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

int doctor_exit_code(const std::vector<Finding>& findings) {
  return has_errors(findings) ? 1 : 0;
}

}  // namespace gpufence
