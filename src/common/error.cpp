#include "common/error.hpp"

namespace gpufence {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::not_found:
      return "not_found";
    case Errc::io:
      return "io";
    case Errc::parse:
      return "parse";
    case Errc::nvml:
      return "nvml";
    case Errc::unsupported:
      return "unsupported";
    case Errc::denied:
      return "denied";
    case Errc::rpc:
      return "rpc";
    case Errc::conflict:
      return "conflict";
    case Errc::internal:
      return "internal";
  }
  return "unknown";
}

}  // namespace gpufence
