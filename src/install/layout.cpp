#include "install/layout.hpp"

namespace gpufence {

NodeLayout layout_for(Distribution d, const HostFs& host) {
  const DistributionRow& row = distribution_row(d);
  NodeLayout l;
  l.distribution = d;
  l.config_path = row.config_input;
  l.socket = row.socket;
  l.restart = restart_command(row, host);
  l.kubelet_dir = row.kubelet_root;
  return l;
}

}  // namespace gpufence
