// How a gpufence-nri process serves: launched by containerd (fd 3), connected to the NRI socket
// (reconnecting, or once for a keeper), or as the keeper of a role (nri/keeper.hpp). Every server
// holds its role's serving lock while it serves, so a keeper never starts a second one.
#pragma once

#include <functional>
#include <string>

#include "common/log.hpp"
#include "nri/keeper.hpp"
#include "nri/session.hpp"
#include "nri/status.hpp"

namespace gpufence::nri {

enum class ServeMode {
  launched,  // containerd's fd; the connection is this process's life; starts the role's keeper
  external,  // connect to the socket, serve, reconnect whenever containerd restarts
  once,      // connect, serve one connection, exit (what a keeper starts)
  keeper,    // keep the role served (run_keeper)
};

struct ServeOptions {
  Role role = Role::decider;
  ServeMode mode = ServeMode::external;
  int launched_fd = -1;
  SessionOptions session;
  std::string socket;
  KeeperFiles files;     // files.dir "" : no serving lock, no keeper
  std::string self_exe;  // this binary, for the keeper and what it starts
};

// Runs the mode; `connection_ended` is told how each connection ended (the decider's status
// file). Returns the process's exit status.
int serve(const ServeOptions& options, PluginHandler& handler,
          const std::function<void(NriState)>& connection_ended, Logger& log);

}  // namespace gpufence::nri
