// The runtime's error, where containerd reads it. containerd's runc shim passes
// `--log <bundle>/log.json --log-format json` and, when the runtime fails, shows the "msg" of the
// last error-level line of that file (runc writes logrus JSON lines:
// {"level":"error","msg":"...","time":"..."}); the runtime's stderr is the container's output
// stream there and is lost. docs/containerd-runtime.md
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace gpufence {

// One line in runc's log format: "json" gives a JSON object, anything else logrus' text form
// (time="..." level=error msg="..."). Ends with '\n'.
std::string runc_log_line(std::string_view format, std::string_view level, std::string_view msg,
                          std::chrono::system_clock::time_point when);

// Appends `line` to `path` (created 0644 if absent) in one write.
Status append_runc_log(const std::string& path, const std::string& line);

}  // namespace gpufence
