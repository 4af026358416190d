#include "dra/model.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

namespace {

using nlohmann::json;

constexpr std::string_view kCheckpointKind = "gpufence.io/dra-checkpoint/v1";

json string_attr(std::string_view v) {
  return json{{"string", std::string(v.substr(0, 64))}};
}
json int_attr(std::int64_t v) {
  return json{{"int", v}};
}

// "550.54.15" -> "550.54.15" as semver needs three numbers: a version attribute only when it
// is one, so a driver version NVML reports in another shape never makes the slice invalid.
bool is_semver_core(std::string_view v) {
  int parts = 0;
  for (std::string_view p : split(v, '.')) {
    if (p.empty() || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    if (p.size() > 1 && p[0] == '0') return false;
    ++parts;
  }
  return parts == 3;
}

const json* find_path(const json& j, std::initializer_list<const char*> keys) {
  const json* at = &j;
  for (const char* k : keys) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(k);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

std::string str_at(const json& j, std::initializer_list<const char*> keys) {
  const json* v = find_path(j, keys);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

}  // namespace

std::string dra_device_name(const Gpu& gpu) {
  return cat("gpu-", gpu.minor);
}

DraDeviceHealth dra_health_of(bool healthy, const std::string& reason,
                              const std::set<std::uint64_t>& no_execute_xids) {
  DraDeviceHealth h{healthy, healthy ? std::string() : reason, false};
  if (healthy) return h;
  if (reason.starts_with("lost")) {
    h.no_execute = true;
  } else if (reason.starts_with("xid ")) {
    if (auto xid = parse_number<std::uint64_t>(std::string_view(reason).substr(4)))
      h.no_execute = no_execute_xids.contains(*xid);
  }
  return h;
}

std::string dra_taint_value(std::string_view reason) {
  // A label value: [A-Za-z0-9._-], starting and ending alphanumeric, at most 63.
  std::string out;
  std::string_view head = reason.substr(0, reason.find(':'));
  for (char c : head) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    out += ok ? c : '-';
    if (out.size() == 63) break;
  }
  while (!out.empty() && !std::isalnum(static_cast<unsigned char>(out.back()))) out.pop_back();
  while (!out.empty() && !std::isalnum(static_cast<unsigned char>(out.front()))) out.erase(0, 1);
  return out.empty() ? "unhealthy" : out;
}

std::string dra_slice_name(const DraIdentity& id) {
  std::string name = cat(id.node, "-", id.driver);
  if (name.size() <= 253) return name;
  // A long node name: its start, a hash of all of it (so two long names never share a slice),
  // and the driver, within a DNS subdomain's 253 characters.
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : id.node) h = (h ^ c) * 16777619u;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(h));
  std::string head = id.node.substr(0, 253 - 1 - 8 - 1 - std::min<size_t>(id.driver.size(), 200));
  while (!head.empty() && (head.back() == '-' || head.back() == '.')) head.pop_back();
  return cat(head, "-", hex, "-", id.driver);
}

json dra_resource_slice(const DraIdentity& id, const std::vector<Gpu>& gpus,
                        std::int64_t generation,
                        const std::map<std::string, DraDeviceHealth>& health) {
  json devices = json::array();
  std::vector<Gpu> sorted = gpus;
  std::sort(sorted.begin(), sorted.end(),
            [](const Gpu& a, const Gpu& b) { return a.minor < b.minor; });
  for (const Gpu& g : sorted) {
    json attrs = {{"uuid", string_attr(g.uuid)},
                  {"index", int_attr(g.index)},
                  {"minor", int_attr(g.minor)},
                  {"productName", string_attr(g.name)},
                  {"pciBusID", string_attr(g.pci_bus_id)}};
    if (g.numa_node) attrs["numaNode"] = int_attr(*g.numa_node);
    if (is_semver_core(g.driver_version))
      attrs["driverVersion"] = json{{"version", g.driver_version}};
    json dev = {{"name", dra_device_name(g)}, {"attributes", attrs}};
    if (g.memory_total) dev["capacity"] = {{"memory", {{"value", std::to_string(g.memory_total)}}}};
    if (auto h = health.find(g.uuid); h != health.end() && !h->second.healthy) {
      dev["taints"] =
          json::array({{{"key", kDraUnhealthyTaintKey},
                        {"value", dra_taint_value(h->second.reason)},
                        {"effect", h->second.no_execute ? "NoExecute" : "NoSchedule"}}});
    }
    devices.push_back(std::move(dev));
  }
  return json{
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceSlice"},
      {"metadata", {{"name", dra_slice_name(id)}}},
      {"spec",
       {{"driver", id.driver},
        {"nodeName", id.node},
        {"pool", {{"name", id.node}, {"generation", generation}, {"resourceSliceCount", 1}}},
        {"devices", devices}}}};
}

bool dra_same_slice_spec(const json& a, const json& b) {
  const json* sa = find_path(a, {"spec"});
  const json* sb = find_path(b, {"spec"});
  if (!sa || !sb) return false;
  // The pool generation is ours to bump, and the API server stamps a taint's timeAdded:
  // compare what we say.
  auto strip = [](json s) {
    if (s.contains("pool")) s["pool"].erase("generation");
    if (s.contains("devices") && s["devices"].is_array())
      for (auto& d : s["devices"])
        if (d.is_object() && d.contains("taints") && d["taints"].is_array())
          for (auto& t : d["taints"])
            if (t.is_object()) t.erase("timeAdded");
    return s;
  };
  return strip(*sa) == strip(*sb);
}

Result<DraPreparedClaim> dra_claim_devices(const json& claim, std::string_view uid,
                                           const DraIdentity& id, const std::vector<Gpu>& gpus) {
  DraPreparedClaim out;
  out.uid = str_at(claim, {"metadata", "uid"});
  out.claim_namespace = str_at(claim, {"metadata", "namespace"});
  out.name = str_at(claim, {"metadata", "name"});
  if (out.uid != uid)
    return fail(Errc::conflict, "ResourceClaim ", out.claim_namespace, "/", out.name, " has uid ",
                out.uid, ", not ", uid, " (deleted and created again)");
  const json* results = find_path(claim, {"status", "allocation", "devices", "results"});
  if (!results || !results->is_array())
    return fail(Errc::invalid_argument, "ResourceClaim ", out.claim_namespace, "/", out.name,
                " is not allocated");
  for (const json& r : *results) {
    if (!r.is_object() || str_at(r, {"driver"}) != id.driver) continue;
    std::string pool = str_at(r, {"pool"}), device = str_at(r, {"device"});
    if (pool != id.node)
      return fail(Errc::invalid_argument, "ResourceClaim ", out.claim_namespace, "/", out.name,
                  ": device ", device, " is from pool ", pool, ", not this node's (", id.node, ")");
    auto gpu = std::find_if(gpus.begin(), gpus.end(),
                            [&](const Gpu& g) { return dra_device_name(g) == device; });
    if (gpu == gpus.end())
      return fail(Errc::not_found, "ResourceClaim ", out.claim_namespace, "/", out.name,
                  ": device ", device, " is no GPU of this node");
    out.devices.push_back({str_at(r, {"request"}), pool, device, gpu_cdi_name(gpu->uuid)});
  }
  return out;
}

std::string dra_checkpoint_text(const std::map<std::string, DraPreparedClaim>& claims) {
  json list = json::array();
  for (const auto& [uid, c] : claims) {
    json devices = json::array();
    for (const auto& d : c.devices)
      devices.push_back(
          {{"request", d.request}, {"pool", d.pool}, {"device", d.device}, {"cdiID", d.cdi_id}});
    list.push_back(
        {{"uid", uid}, {"namespace", c.claim_namespace}, {"name", c.name}, {"devices", devices}});
  }
  return json{{"kind", kCheckpointKind}, {"claims", list}}.dump(
             1, ' ', false, json::error_handler_t::replace) +
         "\n";
}

Result<std::map<std::string, DraPreparedClaim>> dra_parse_checkpoint(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("kind", "") != kCheckpointKind ||
      !j.contains("claims") || !j["claims"].is_array())
    return fail(Errc::invalid_argument, "not a gpufence-dra checkpoint (kind ", kCheckpointKind,
                ")");
  std::map<std::string, DraPreparedClaim> out;
  for (const json& c : j["claims"]) {
    if (!c.is_object()) return fail(Errc::invalid_argument, "checkpoint: a claim is no object");
    DraPreparedClaim claim{str_at(c, {"uid"}), str_at(c, {"namespace"}), str_at(c, {"name"}), {}};
    if (claim.uid.empty()) return fail(Errc::invalid_argument, "checkpoint: a claim has no uid");
    if (c.contains("devices") && c["devices"].is_array()) {
      for (const json& d : c["devices"])
        claim.devices.push_back({str_at(d, {"request"}), str_at(d, {"pool"}), str_at(d, {"device"}),
                                 str_at(d, {"cdiID"})});
    }
    out.emplace(claim.uid, std::move(claim));
  }
  return out;
}

}  // namespace gpufence
