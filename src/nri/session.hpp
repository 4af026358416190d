// One NRI connection from the plugin's side, over a connected stream socket: register, then answer
// the runtime until it goes away. Single-threaded: the reader never waits for a reply, because
// containerd calls Configure before it answers RegisterPlugin (nri@v0.12.0:pkg/adaptation/
// plugin.go start), and nothing is sent to the runtime from inside a handler (docs/nri.md).
#pragma once

#include <string>

#include "common/log.hpp"
#include "common/paths.hpp"
#include "nri/service.hpp"

namespace gpufence::nri {

struct SessionOptions {
  std::string name =
      std::string(paths::kNriPluginName);  // [a-zA-Z0-9_.+-] (nri@v0.12.0:pkg/api/plugin.go)
  std::string index = "10";                // two digits: the order among plugins
};

// Runs until the runtime closes the connection (ok) or breaks the protocol or refuses the
// registration (an error). Does not close `fd`.
Status run_session(int fd, const SessionOptions& options, PluginHandler& handler, Logger& log);

// Connects to the runtime's NRI socket.
Result<int> connect_nri_socket(const std::string& path);

}  // namespace gpufence::nri
