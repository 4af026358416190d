#include "autoscale/leader.hpp"

#include "autoscale/events.hpp"

namespace gpufence {

LeaderElector::LeaderElector(KubeClient& kube, LeaseOptions options)
    : m_kube(kube), m_opt(std::move(options)) {}

std::string LeaderElector::path() const {
  return "/apis/coordination.k8s.io/v1/namespaces/" + m_opt.ns + "/leases/" + m_opt.name;
}

nlohmann::json LeaderElector::desired_spec(const nlohmann::json& current) const {
  nlohmann::json spec = current.is_object() ? current : nlohmann::json::object();
  const std::string now = micro_time(std::chrono::system_clock::now());
  if (spec.value("holderIdentity", "") != m_opt.identity) {
    spec["acquireTime"] = now;
    spec["leaseTransitions"] =
        spec.value("leaseTransitions", 0L) + (spec.value("holderIdentity", "").empty() ? 0 : 1);
  }
  spec["holderIdentity"] = m_opt.identity;
  spec["leaseDurationSeconds"] = m_opt.duration.count();
  spec["renewTime"] = now;
  return spec;
}

Result<bool> LeaderElector::try_acquire_or_renew(SteadyTime now) {
  m_leader = false;
  auto current = m_kube.call("GET", path());
  if (!current) return std::unexpected(current.error().wrap("read lease " + path()));
  if (current->status == 404) {
    nlohmann::json lease{{"apiVersion", "coordination.k8s.io/v1"},
                         {"kind", "Lease"},
                         {"metadata", {{"name", m_opt.name}, {"namespace", m_opt.ns}}},
                         {"spec", desired_spec(nlohmann::json::object())}};
    lease["spec"]["leaseTransitions"] = 0;
    auto created = m_kube.call(
        "POST", "/apis/coordination.k8s.io/v1/namespaces/" + m_opt.ns + "/leases", lease.dump());
    if (!created) return std::unexpected(created.error().wrap("create lease " + path()));
    if (created->status == 409) return false;  // a peer created it first
    if (created->status < 200 || created->status >= 300)
      return fail(Errc::rpc, "create lease ", path(), ": HTTP ", created->status);
    m_holder = m_opt.identity;
    m_observed_rv = created->body["metadata"].value("resourceVersion", "");
    m_observed_at = now;
    return m_leader = true;
  }
  if (current->status < 200 || current->status >= 300)
    return fail(Errc::rpc, "read lease ", path(), ": HTTP ", current->status);
  nlohmann::json lease = current->body;
  const auto spec = lease.value("spec", nlohmann::json::object());
  const std::string rv = lease["metadata"].value("resourceVersion", "");
  if (rv != m_observed_rv) {
    m_observed_rv = rv;
    m_observed_at = now;
  }
  m_holder = spec.value("holderIdentity", "");
  const auto duration = std::chrono::seconds(spec.value("leaseDurationSeconds", 0L));
  if (!m_holder.empty() && m_holder != m_opt.identity && now < m_observed_at + duration)
    return false;  // held, and renewed within its duration as far as we can tell
  lease["spec"] = desired_spec(spec);
  auto written = m_kube.call("PUT", path(), lease.dump());
  if (!written) return std::unexpected(written.error().wrap("renew lease " + path()));
  if (written->status == 409) return false;  // a peer wrote it first: it holds it now
  if (written->status < 200 || written->status >= 300)
    return fail(Errc::rpc, "renew lease ", path(), ": HTTP ", written->status);
  m_holder = m_opt.identity;
  m_observed_rv = written->body["metadata"].value("resourceVersion", "");
  m_observed_at = now;
  return m_leader = true;
}

Status LeaderElector::release() {
  if (!m_leader) return {};
  m_leader = false;
  auto lease = m_kube.get(path());
  if (!lease) return std::unexpected(lease.error().wrap("release lease"));
  if ((*lease)["spec"].value("holderIdentity", "") != m_opt.identity) return {};
  (*lease)["spec"]["holderIdentity"] = "";
  (*lease)["spec"]["leaseDurationSeconds"] = 1;
  (*lease)["spec"]["renewTime"] = micro_time(std::chrono::system_clock::now());
  auto written = m_kube.request("PUT", path(), lease->dump());
  if (!written) return std::unexpected(written.error().wrap("release lease"));
  return {};
}

}  // namespace gpufence
