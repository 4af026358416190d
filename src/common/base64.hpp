// Base64 (RFC 4648, standard alphabet, padded), as Go's encoding/json writes a []byte: the
// kubelet's device checkpoint stores each Allocate answer that way (AllocResp).
#pragma once

#include <optional>
#include <string>

namespace gpufence {

std::string base64_encode(const std::string& bytes);
// nullopt for anything but padded standard base64.
std::optional<std::string> base64_decode(const std::string& text);

}  // namespace gpufence
