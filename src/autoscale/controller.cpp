#include "autoscale/controller.hpp"

#include <set>

#include "common/file.hpp"
#include "common/strings.hpp"

namespace gpufence {
namespace {

std::string url_escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/')
      out += static_cast<char>(c);
    else
      out += cat("%", "0123456789ABCDEF"[c >> 4], "0123456789ABCDEF"[c & 15]);
  }
  return out;
}

}  // namespace

Result<long> free_gpus(KubeClient& kube, const std::string& node_selector,
                       const std::string& resource) {
  auto nodes =
      kube.get("/api/v1/nodes" +
               (node_selector.empty() ? "" : "?labelSelector=" + url_escape(node_selector)));
  if (!nodes) return std::unexpected(nodes.error());
  long allocatable = 0;
  std::set<std::string> names;
  for (const auto& n : nodes->value("items", nlohmann::json::array())) {
    names.insert(n.value("metadata", nlohmann::json::object()).value("name", ""));
    allocatable += resource_quantity(
        n.value("status", nlohmann::json::object()).value("allocatable", nlohmann::json::object()),
        resource);
  }
  auto pods = kube.get("/api/v1/pods");
  if (!pods) return std::unexpected(pods.error());
  long used = 0;
  for (const auto& p : pods->value("items", nlohmann::json::array())) {
    std::string phase = p.value("status", nlohmann::json::object()).value("phase", "");
    if (phase == "Succeeded" || phase == "Failed") continue;
    auto spec = p.value("spec", nlohmann::json::object());
    std::string node = spec.value("nodeName", "");
    if (!node.empty() && !names.contains(node)) continue;
    for (const auto& c : spec.value("containers", nlohmann::json::array())) {
      used += resource_quantity(
          c.value("resources", nlohmann::json::object()).value("limits", nlohmann::json::object()),
          resource);
    }
  }
  return std::max(0L, allocatable - used);
}

Result<ReconcileResult> reconcile(KubeClient& kube, const AutoscaleOptions& opt,
                                  const StreamSource& streams, Stabilizer& stabilizer,
                                  SteadyTime now) {
  ReconcileResult out;
  auto demand = streams();
  if (!demand) return std::unexpected(demand.error().wrap("stream demand"));
  out.streams = *demand;
  auto capacity = free_gpus(kube, opt.node_selector, opt.resource);
  if (!capacity) return std::unexpected(capacity.error().wrap("free GPU capacity"));
  out.free_gpus = *capacity;
  const std::string path =
      cat("/apis/apps/v1/namespaces/", opt.ns, "/deployments/", opt.deployment, "/scale");
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto scale = kube.get(path);
    if (!scale) return std::unexpected(scale.error().wrap("read scale"));
    out.current = scale->value("spec", nlohmann::json::object()).value("replicas", 0L);
    auto rec = recommend({out.streams, opt.streams_per_pod, out.current, opt.min_replicas,
                          opt.max_replicas, opt.gpus_per_pod, out.free_gpus, 0.1});
    out.reason = rec.reason;
    // Only the first attempt feeds the stabiliser: a retry is the same decision, re-applied.
    out.desired = attempt == 0 ? stabilizer.stabilize(rec.replicas, out.current, now) : out.desired;
    if (out.desired == out.current || opt.dry_run) return out;
    (*scale)["spec"]["replicas"] = out.desired;
    auto written = kube.request("PUT", path, scale->dump());
    if (written) {
      out.scaled = true;
      return out;
    }
    if (written.error().code != Errc::conflict)
      return std::unexpected(written.error().wrap("write scale"));
    // 409: someone changed the Deployment since we read it; read again and re-apply.
  }
  return fail(Errc::conflict, "scale of ", opt.ns, "/", opt.deployment,
              " kept changing under us (3 conflicts)");
}

StreamSource streams_from_configmap(KubeClient& kube, const std::string& spec) {
  return [&kube, spec]() -> Result<long> {
    auto slash = spec.find('/');
    auto colon = spec.find(':');
    if (slash == std::string::npos || colon == std::string::npos || colon < slash) {
      return fail(Errc::invalid_argument, "--streams-configmap wants NAMESPACE/NAME:KEY, got '",
                  spec, "'");
    }
    auto cm = kube.get(cat("/api/v1/namespaces/", spec.substr(0, slash), "/configmaps/",
                           spec.substr(slash + 1, colon - slash - 1)));
    if (!cm) return std::unexpected(cm.error());
    std::string key = spec.substr(colon + 1);
    auto data = cm->value("data", nlohmann::json::object());
    if (!data.contains(key) || !data[key].is_string())
      return fail(Errc::not_found, "ConfigMap ", spec, " has no key ", key);
    auto n = parse_number<long>(trim(data[key].get<std::string>()));
    if (!n || *n < 0)
      return fail(Errc::parse, "ConfigMap ", spec, ": '", data[key].get<std::string>(),
                  "' is not a stream count");
    return *n;
  };
}

StreamSource streams_from_file(const std::string& path) {
  return [path]() -> Result<long> {
    auto text = read_file(path);
    if (!text) return std::unexpected(text.error());
    auto n = parse_number<long>(trim(*text));
    if (!n || *n < 0) return fail(Errc::parse, path, ": '", trim(*text), "' is not a stream count");
    return *n;
  };
}

}  // namespace gpufence
