#include "nri/run.hpp"

#include <unistd.h>

#include <thread>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "runtime/config.hpp"

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

// Forwards every call; after a Configure the handler took, runs `then` (the launched plugin's
// set-up that needs the plugin config containerd sends).
class AfterConfigure : public PluginHandler {
 public:
  AfterConfigure(PluginHandler& inner, std::function<void(const RuntimeInfo&)> then)
      : m_inner(inner), m_then(std::move(then)) {}
  uint32_t events() const override { return m_inner.events(); }
  Status configured(const RuntimeInfo& runtime) override {
    auto st = m_inner.configured(runtime);
    if (st) m_then(runtime);
    return st;
  }
  void synchronized(const api::SynchronizeRequest& r) override { m_inner.synchronized(r); }
  Result<api::ContainerAdjustment> create_container(const api::PodSandbox& pod,
                                                    const api::Container& container,
                                                    SteadyTime received) override {
    return m_inner.create_container(pod, container, received);
  }
  api::ValidateContainerAdjustmentResponse validate(
      const api::ValidateContainerAdjustmentRequest& r) override {
    return m_inner.validate(r);
  }

 private:
  PluginHandler& m_inner;
  std::function<void(const RuntimeInfo&)> m_then;
};

// A launched plugin learns its configuration from Configure (plugin_config_path/NN-name.conf;
// containerd gives a launched plugin no environment of its own): only then does it know its
// keeper directory and socket. It takes its serving lock there (waiting a little for a server of
// containerd's previous life to close, serving regardless: containerd kills a launched plugin
// that does not register in time), keeps the config for the keeper in that directory, and starts
// the keeper, which brings the role back once this connection is gone.
int serve_launched(const ServeOptions& o, PluginHandler& handler,
                   const std::function<void(NriState)>& ended, Logger& log) {
  std::optional<Fd> held;
  AfterConfigure wrapped(handler, [&](const RuntimeInfo& runtime) {
    ServeOptions effective = o;
    std::string config_path;
    if (!runtime.config.empty()) {
      auto cfg = parse_runtime_config(runtime.config, "the NRI plugin config");
      if (!cfg) return;  // the handler refused it already
      effective.files.dir = cfg->nri_keeper_dir;
      effective.socket = cfg->nri_socket;
      if (!effective.files.dir.empty()) {
        config_path = cat(effective.files.dir, "/", role_name(o.role), ".toml");
        if (auto w = write_file_atomic(config_path, runtime.config, Durability::none,
                                       Symlinks::none, MakeDir::yes);
            !w) {
          log.warn("nri.keeper_unavailable", {{"error", w.error().message}});
          return;
        }
      }
    }
    held = serving_lock(effective, LockWait::yes, std::chrono::milliseconds(1000), log);
    if (!held)
      log.warn("nri.lock_busy", {{"lock", effective.files.serving(o.role)},
                                 {"why", "another server still holds it"}});
    ensure_keeper(effective.files, o.role, o.self_exe, effective.socket, config_path, log);
  });
  auto st = run_session(o.launched_fd, o.session, wrapped, log);
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
