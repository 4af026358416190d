// Leader election on a coordination.k8s.io/v1 Lease, so two autoscaler replicas can run and only
// one scales (docs/autoscale.md, "Leader election"). As client-go's leaderelection does: the
// holder renews spec.renewTime each period; another replica takes over only when the record has
// not changed for leaseDurationSeconds *by its own clock* (the time it observed the change, not
// the renewTime written by a peer whose clock may differ); every write carries the Lease's
// resourceVersion, so of two replicas racing for an expired Lease exactly one wins (409 for the
// other).
#pragma once

#include <chrono>
#include <string>

#include "autoscale/policy.hpp"
#include "common/error.hpp"
#include "kube/client.hpp"

namespace gpufence {

struct LeaseOptions {
  std::string ns, name;
  std::string identity;  // this replica: holderIdentity while it leads
  std::chrono::seconds duration{45};
};

class LeaderElector {
 public:
  LeaderElector(KubeClient& kube, LeaseOptions options);
  // Creates, renews or takes over the Lease; true when this replica holds it now. An error (the
  // API could not be asked) also means: do not act as the leader.
  Result<bool> try_acquire_or_renew(SteadyTime now);
  // Gives the Lease up (holderIdentity emptied), so a peer takes over at once instead of after
  // the lease duration. Only when this replica holds it.
  Status release();
  const std::string& holder() const { return m_holder; }  // as last seen
  std::string path() const;

 private:
  nlohmann::json desired_spec(const nlohmann::json& current) const;
  KubeClient& m_kube;
  LeaseOptions m_opt;
  bool m_leader = false;
  std::string m_holder;
  std::string m_observed_rv;  // the record as last seen, and when (our clock)
  SteadyTime m_observed_at{};
};

}  // namespace gpufence
