#include "nri/run.hpp"

#include <unistd.h>

#include <thread>

#include "common/strings.hpp"

namespace gpufence::nri {
namespace {

// The serving lock: a launched plugin waits for it a little (a server of containerd's previous
// life may still be closing) and serves regardless (containerd kills a launched plugin that
// does not register in time); a connecting one serves only when it holds it.
std::optional<Fd> serving_lock(const ServeOptions& o, LockWait wait,
                               std::chrono::milliseconds timeout, Logger& log) {
  if (o.files.dir.empty()) return Fd();
  auto lock = take_lock(o.files.serving(o.role), wait, timeout);
  if (!lock) {
    log.warn("nri.lock_unavailable", {{"error", lock.error().message}});
    return Fd();  // no lock directory: serve without (the keeper cannot run either)
  }
  if (!*lock) return std::nullopt;
  return std::move(**lock);
}

int serve_launched(const ServeOptions& o, PluginHandler& handler,
                   const std::function<void(NriState)>& ended, Logger& log) {
  auto lock = serving_lock(o, LockWait::yes, std::chrono::milliseconds(2000), log);
  if (!lock)
    log.warn("nri.lock_busy",
             {{"lock", o.files.serving(o.role)}, {"why", "another server still holds it"}});
  // The keeper brings the role back once this connection is gone (containerd launches once).
  ensure_keeper(o.files, o.role, o.self_exe, o.socket, log);
  auto st = run_session(o.launched_fd, o.session, handler, log);
  if (!st) log.error("nri.session_failed", {{"error", st.error().message}});
  ended(NriState::exited);
  return st ? 0 : 1;
}

int serve_connected(const ServeOptions& o, PluginHandler& handler,
                    const std::function<void(NriState)>& ended, Logger& log) {
  const bool once = o.mode == ServeMode::once;
  bool announced_wait = false;
  if (!once) ended(NriState::waiting);
  for (;;) {
    auto lock = serving_lock(o, LockWait::no, {}, log);
    if (!lock) {
      if (once) return 0;  // someone serves the role already
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    auto fd = connect_nri_socket(o.socket);
    if (!fd) {
      if (once) return 1;
      if (!announced_wait)
        log.warn("nri.waiting_for_runtime", {{"socket", o.socket}, {"error", fd.error().message}});
      announced_wait = true;
      lock.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    announced_wait = false;
    log.info("nri.connected", {{"socket", o.socket}, {"role", std::string(role_name(o.role))}});
    auto st = run_session(*fd, o.session, handler, log);
    ::close(*fd);
    ended(once ? NriState::exited : NriState::waiting);
    if (!st)
      log.error("nri.session_failed", {{"error", st.error().message}});
    else
      log.info("nri.disconnected", {{"socket", o.socket}});
    if (once) return st ? 0 : 1;
    lock.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

int serve(const ServeOptions& options, PluginHandler& handler,
          const std::function<void(NriState)>& connection_ended, Logger& log) {
  switch (options.mode) {
    case ServeMode::launched:
      return serve_launched(options, handler, connection_ended, log);
    case ServeMode::keeper:
      return run_keeper(options.files, options.role, options.self_exe, options.socket, log);
    case ServeMode::external:
    case ServeMode::once:
      return serve_connected(options, handler, connection_ended, log);
  }
  return 1;
}

}  // namespace gpufence::nri
