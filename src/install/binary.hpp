// Putting gpufence-runtime onto the host so that a container create running at that moment never
// execs a half-written file: the bytes go to a versioned file named by their content
// (<dir>/gpufence-runtime-<hash>, written to a temp name, fsynced, renamed), then the stable
// path containerd's BinaryName names is a symlink swapped with rename(2), which is atomic.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hostfs.hpp"
#include "common/paths.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

struct BinaryInstallOptions {
  std::string source;                                           // a path this process can read
  std::string link = std::string(kRuntimeBinaryPath);           // host path: the stable name
  std::string versions_dir = std::string(paths::kVersionsDir);  // host path: the versioned files
};

enum class Changed { yes, no };

struct BinaryInstall {
  std::string target;  // host path of the versioned file the link points at
  Changed changed = Changed::no;
  std::vector<std::string> pruned;  // older versions removed (all but the previous one)
};

// 64-bit FNV-1a of the bytes, in hex: names a version by its content (not a security check;
// the bytes themselves are compared before a version is reused).
std::string content_tag(std::string_view bytes);

Result<BinaryInstall> install_binary(const HostFs& host, const BinaryInstallOptions& opt);

// The versioned host path install_binary would point the link at, without touching the host:
// fails when the source is unreadable or not an ELF executable (a refusal: nothing written).
Result<std::string> planned_binary_target(const BinaryInstallOptions& opt);

// The host path the stable link names now (nullopt: no link there).
std::optional<std::string> binary_link_target(const HostFs& host, const std::string& link);
// Points the stable link at `target` in one rename (a failed re-install puts the old one back).
Status point_binary_link(const HostFs& host, const std::string& link, const std::string& target);

// Removes the link (only if it points into versions_dir) and every versioned file. Returns what
// it removed, as host paths.
Result<std::vector<std::string>> remove_binary(const HostFs& host, const BinaryInstallOptions& opt);

}  // namespace gpufence
