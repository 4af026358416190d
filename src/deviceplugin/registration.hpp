// The registration loop: keeps the plugin served on its socket and registered with the kubelet,
// whatever happens to the plugin directory. It reacts to
// - kubelet.sock created (the kubelet restarted): re-serve and re-register;
// - our socket removed while we serve (the kubelet wiped the directory): the same;
// - the directory itself removed or replaced (`rm -rf` and re-create, IN_IGNORED): re-arm the
//   watch on the new directory, then the same;
// - lost inotify events (IN_Q_OVERFLOW): judge by the state of the directory instead;
// - no ListAndWatch stream open for `reregister_after` while registered (the kubelet lost us
//   without any of the above): re-register.
// See docs/deviceplugin.md for the kubelet behaviour behind each.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "common/error.hpp"
#include "common/log.hpp"
#include "deviceplugin/metrics.hpp"

namespace gpufence {

// What one read of the directory's inotify events says (pure, see parse_dir_events).
struct DirEvents {
  bool kubelet_socket_created = false;
  bool own_socket_removed = false;  // a hint only: our own restarts and gRPC unlink it too
  bool watch_lost = false;          // IN_IGNORED / IN_DELETE_SELF / IN_MOVE_SELF / IN_UNMOUNT
  bool overflowed = false;          // IN_Q_OVERFLOW: events were dropped
};

// Reads a buffer of inotify_event records as read(2) returned them.
// Reads a buffer of inotify_event records as read(2) returned them; only records of watch `wd`
// count (a removed watch's last IN_IGNORED arrives after it was replaced), and IN_Q_OVERFLOW.
DirEvents parse_dir_events(std::span<const char> buffer, int wd, std::string_view kubelet_socket,
                           std::string_view own_socket);

// The seams the loop drives: the gRPC server and the Register call live in plugin.cpp.
struct RegistrationHooks {
  std::function<Status()> serve;         // start serving on the plugin socket
  std::function<void()> stop_serving;    // stop, end every stream, remove the socket
  std::function<Status()> register_now;  // Register with the kubelet (and log and count it)
  // Since when no ListAndWatch stream has been open; nullopt while one is.
  std::function<std::optional<std::chrono::steady_clock::time_point>()> streams_idle_since;
};

struct RegistrationSettings {
  std::filesystem::path plugin_dir;
  std::string kubelet_socket = "kubelet.sock";
  std::string own_socket;
  // nullopt: never re-register for want of a stream.
  std::optional<std::chrono::milliseconds> reregister_after;
  std::chrono::milliseconds retry = std::chrono::seconds(1);
};

class RegistrationLoop {
 public:
  RegistrationLoop(RegistrationSettings settings, RegistrationHooks hooks, Logger& log,
                   PluginMetrics& metrics);
  ~RegistrationLoop();
  RegistrationLoop(const RegistrationLoop&) = delete;
  RegistrationLoop& operator=(const RegistrationLoop&) = delete;

  // Serves and registers until `stop_fd` is readable, then stops serving. Fails only when the
  // directory cannot be watched at all, or when it was deleted under a mount that can never see
  // its replacement (a container's bind mount: exiting lets the container restart on the new one).
  Status run(int stop_fd);

  bool registered() const { return m_registered; }

 private:
  struct DirId {
    dev_t dev = 0;
    ino_t ino = 0;
    nlink_t links = 0;  // 0: deleted, yet still reachable here (through a bind mount)
    bool same_inode(const DirId& o) const { return dev == o.dev && ino == o.ino; }
  };

  // The named steps of run().
  Status arm_watch();
  Status check_not_deleted() const;
  void try_register();
  Status handle_events();
  void check_streams();
  void restart(std::string_view why);
  std::optional<DirId> identity(const std::filesystem::path& p) const;

  RegistrationSettings m_cfg;
  RegistrationHooks m_hooks;
  Logger& m_log;
  PluginMetrics& m_metrics;
  std::string m_kubelet_path, m_own_path;
  int m_inotify = -1;
  int m_watch = -1;                           // -1 while the directory is not watched
  std::optional<DirId> m_dir_id;              // the directory the watch is on
  std::optional<DirId> m_registered_kubelet;  // kubelet.sock when we registered
  bool m_dir_missing_logged = false;
  bool m_serving = false;
  std::atomic<bool> m_registered{false};
  bool m_waiting_logged = false;
  std::chrono::steady_clock::time_point m_registered_at{};
  std::chrono::steady_clock::time_point m_retry_at{};
};

}  // namespace gpufence
