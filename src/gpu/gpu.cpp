#include "gpu/gpu.hpp"

namespace gpufence {

std::string_view link_name(Link link) {
  switch (link) {
    case Link::nvlink:
      return "NVLINK";
    case Link::internal:
      return "INTERNAL";
    case Link::single_switch:
      return "PIX";
    case Link::multiple_switch:
      return "PXB";
    case Link::host_bridge:
      return "PHB";
    case Link::numa_node:
      return "NODE";
    case Link::system:
      return "SYS";
    case Link::unknown:
      return "UNKNOWN";
  }
  return "UNKNOWN";
}

}  // namespace gpufence
