// The keeper: what brings gpufence-nri (and its fence) back after any death, with no human action
// and no containerd restart (docs/nri.md, "When gpufence-nri is gone").
//
// containerd launches a plugin from plugin_path once, at its start, and never again: when the
// connection of a launched plugin closes (a crash, an OOM kill, or containerd closing it after a
// timeout), containerd SIGKILLs that process (nri@v0.12.0 pkg/adaptation/adaptation.go
// removeClosedPlugins -> plugin.stop). So the launched process cannot be its own supervisor. It
// starts a keeper instead: a detached process (its own session), one per role and node (a lock
// file), that watches the role's serving lock and, while no process holds it, starts
// `gpufence-nri --once` connected to containerd's NRI socket as an external plugin under the
// same name (required_plugins counts it). A server stopped (SIGSTOP, state T) for longer than
// kStoppedGrace is killed and replaced. The keeper exits when its binary is replaced or removed
// (an upgrade or uninstall) or after kIdleExit without containerd's socket answering.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/log.hpp"

namespace gpufence::nri {

enum class Role { decider, fence };
std::string_view role_name(Role role);  // "decider", "fence"

inline constexpr auto kStoppedGrace = std::chrono::seconds(2);
inline constexpr auto kIdleExit = std::chrono::seconds(120);
inline constexpr auto kRespawnEvery = std::chrono::milliseconds(500);

// The lock files of one role in gpufence's own directory (made 0700; no link anywhere in it).
struct KeeperFiles {
  std::string dir;
  std::string serving(Role role) const;  // held by the process serving the role's connection
  std::string keeper(Role role) const;   // held by the role's keeper
};

enum class LockWait { no, yes };

// An exclusive flock on `path` (created 0600, opened without following links), or nullopt when
// another process holds it and `wait` is no (or `timeout` passed). The holder's pid and start
// time are written into the file.
Result<std::optional<Fd>> take_lock(const std::string& path, LockWait wait,
                                    std::chrono::milliseconds timeout = {});

// Who holds a lock: its pid and start time (field 22 of /proc/<pid>/stat), so that a pid reused
// by another process is never taken for it.
struct LockHolder {
  pid_t pid = 0;
  uint64_t start_time = 0;
  bool operator==(const LockHolder&) const = default;
};

// The holder written in a held lock file; nullopt when the lock is free (or the file unreadable).
std::optional<LockHolder> lock_holder(const std::string& path);

// Whether the holder is still that process and /proc/<pid>/stat says it is stopped (T, t).
bool process_stopped(const LockHolder& holder);

// The holder's executable now (/proc/<pid>/exe), "" when it is gone or another process.
std::string holder_executable(const LockHolder& holder);

// Starts the keeper of `role` (a detached `self_exe --keeper [--fence]`) unless one runs; it and
// what it starts read `config_path` ("" : this process's own GPUFENCE_RUNTIME_CONFIG, or the
// default /etc/gpufence/runtime.toml).
void ensure_keeper(const KeeperFiles& files, Role role, const std::string& self_exe,
                   const std::string& socket, const std::string& config_path, Logger& log);

// The keeper's loop (until its binary changes or containerd stays away): `self_exe --once
// [--fence] --socket SOCKET` whenever nobody serves the role.
int run_keeper(const KeeperFiles& files, Role role, const std::string& self_exe,
               const std::string& socket, Logger& log);

}  // namespace gpufence::nri
