#include "install/watch.hpp"

#include <algorithm>

#include "common/http_server.hpp"

namespace gpufence {

namespace {

using std::chrono::milliseconds;

// How often a waiting loop looks at stop_requested: SIGTERM ends it within this.
constexpr milliseconds kStopSlice{200};
// Between CRI asks while containerd may be coming back (install's own wait uses the same).
constexpr milliseconds kRetrySlice{250};
// One CRI Status ask; a containerd that takes longer is asked again within the ready timeout.
constexpr milliseconds kAskTimeout{5000};

// Sleeps on env's clock until `until`, in slices, so a stop request is seen in time. False when
// asked to stop.
bool wait_until(const InstallEnv& env, std::chrono::steady_clock::time_point until,
                const WatchHooks& hooks) {
  while (!hooks.stop_requested()) {
    auto now = env.now();
    if (now >= until) return true;
    env.sleep(std::min(kStopSlice, std::chrono::ceil<milliseconds>(until - now)));
  }
  return false;
}

// Whether the running containerd has what the first run installed: the handler, NRI, or both.
Result<bool> still_loaded(const InstallOptions& opt, const InstallEnv& env, Enforcement mode,
                          const std::string& socket) {
  if (socket.empty()) return false;
  if (uses_handler(mode)) {
    auto h = handler_loaded(env, socket, opt.runtime_name, opt.binary.link, kAskTimeout);
    if (!h || !*h) return h;
  }
  return !uses_nri(mode) || nri_enabled(env, opt.nri_socket);
}

}  // namespace

void watch_install_loop(const InstallOptions& opt, const InstallEnv& env,
                        const InstallReport& first, milliseconds interval,
                        std::atomic<bool>& healthy, const WatchHooks& hooks) {
  // What the first run installed decides what is checked, for the whole watch.
  const Enforcement mode = first.enforcement.value_or(Enforcement::runtime);
  std::string socket = first.socket;
  auto next = env.now();
  while (!hooks.stop_requested()) {
    next += interval;
    if (!wait_until(env, next, hooks)) break;
    auto loaded = still_loaded(opt, env, mode, socket);
    // containerd not answering may be one mid-restart: give it the ready timeout to come back
    // before restarting it again.
    auto patience = env.now() + opt.ready_timeout;
    while (!loaded && !hooks.stop_requested() && env.now() < patience) {
      env.sleep(kRetrySlice);
      loaded = still_loaded(opt, env, mode, socket);
    }
    if (loaded && *loaded) {
      healthy = true;
      continue;
    }
    hooks.say(cat(
        "handler ",
        loaded ? "missing from the running containerd" : "unverifiable: " + loaded.error().message,
        "; installing again"));
    auto report = run_install(opt, env);
    hooks.reinstalled(report);
    socket = report.socket;
    healthy = report.ok();
  }
}

Status watch_install(const InstallOptions& opt, const InstallEnv& env, const InstallReport& first,
                     const WatchOptions& watch, const WatchHooks& hooks) {
  std::atomic<bool> healthy = first.ok();
  HttpServer server;
  auto render = [&healthy] {
    return cat("# HELP gpufence_install_handler_loaded 1 when containerd runs the handler\n",
               "# TYPE gpufence_install_handler_loaded gauge\n", "gpufence_install_handler_loaded ",
               healthy ? 1 : 0, "\n");
  };
  auto is_healthy = [&healthy] { return healthy.load(); };
  if (auto st = server.start(watch.healthz_address,
                             {render, is_healthy, "containerd does not run what install put in"});
      !st)
    return st;
  hooks.say(cat("serving /healthz on ", watch.healthz_address, ", re-checking every ",
                std::chrono::duration<double>(watch.interval).count(), "s"));
  watch_install_loop(opt, env, first, watch.interval, healthy, hooks);
  server.stop();
  return {};
}

}  // namespace gpufence
