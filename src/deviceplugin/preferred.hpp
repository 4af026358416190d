// GetPreferredAllocation as a pure function: from the available GPUs pick `size` that are best
// connected — NVLink first (more links better), then a shared PCIe switch or host bridge, then
// the same NUMA node — always keeping the ones the kubelet says must be included.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

// Higher is better connected; symmetric.
using PairScore = std::function<int(const std::string& a, const std::string& b)>;

Result<std::vector<std::string>> preferred_allocation(const std::vector<std::string>& available,
                                                      const std::vector<std::string>& must_include,
                                                      int size, const PairScore& score);

}  // namespace gpufence
