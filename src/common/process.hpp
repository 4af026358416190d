// Running a helper program and capturing what it prints (diff, ldconfig, containerd).
#pragma once

#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpufence {

struct ProcessResult {
  int exit_code = -1;  // 128+N when killed by signal N
  std::string out;     // stdout and stderr together
};

// Runs argv (argv[0] searched on PATH) to completion. Fails only when it cannot be started.
Result<ProcessResult> run_process(const std::vector<std::string>& argv);

// A unified diff of two texts labelled `old_label` and `new_label` (uses diff(1), which Debian
// marks essential); empty when they are equal.
Result<std::string> unified_diff(const std::string& old_text, const std::string& new_text,
                                 const std::string& old_label, const std::string& new_label);

}  // namespace gpufence
