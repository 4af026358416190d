// Running a helper program and capturing what it prints (diff, ldconfig, containerd).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct ProcessResult {
  int exit_code = -1;  // 128+N when killed by signal N
  bool timed_out = false;
  std::string out;  // stdout and stderr together
};

struct ProcessOptions {
  // The child's whole environment; nullopt inherits ours. Code that runs as root next to a
  // container passes a fixed one.
  std::optional<std::vector<std::string>> env;
  // Killed (SIGKILL) after this long; zero waits forever.
  std::chrono::milliseconds timeout{0};
};

// A child's environment and standard descriptors.
struct SpawnOptions {
  // The child's whole environment; nullopt inherits ours.
  std::optional<std::vector<std::string>> env;
  // Descriptors of ours that become the child's 0, 1 and 2. -1: /dev/null for stdin, our own
  // stdout and stderr.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// Starts argv (argv[0] searched on PATH unless it contains '/') and returns its pid, to be
// reaped by the caller (wait_for_exit). The one posix_spawn of the project: the child gets no
// descriptor of ours beyond 0-2 and the default signal mask, whatever ours blocks (StopSignals
// blocks SIGTERM and SIGINT in every long-running process; a child that inherited that could not
// be stopped).
Result<pid_t> spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options = {});

// Runs argv (argv[0] searched on PATH unless it contains '/') to completion. Fails only when it
// cannot be started. No descriptor of ours leaks into the child.
Result<ProcessResult> run_process(const std::vector<std::string>& argv,
                                  const ProcessOptions& options = {});

// Waits for child `pid` to exit; past `timeout` (zero: no limit) kills it with SIGKILL and reaps
// it. The result has no output.
ProcessResult wait_for_exit(pid_t pid, std::chrono::milliseconds timeout);

// A unified diff of two texts labelled `old_label` and `new_label` (uses diff(1), which Debian
// marks essential); empty when they are equal.
Result<std::string> unified_diff(const std::string& old_text, const std::string& new_text,
                                 const std::string& old_label, const std::string& new_label);

// This process's executable as the kernel names it (/proc/self/exe: an absolute path, with
// " (deleted)" once the file was replaced); "" when it cannot be read. Every binary that finds
// itself, or a file shipped beside it, asks here.
std::string self_executable();
// `name` in this executable's directory; `name` itself when the executable cannot be read.
std::string beside_self(std::string_view name);

}  // namespace gpufence
