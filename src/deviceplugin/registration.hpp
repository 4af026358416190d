// The registration loop: keeps the plugin served on its socket and registered with the kubelet,
// whatever happens to the plugin directory, exactly once per kubelet instance (a kubelet.sock
// file: device, inode and birth time). It reacts to
// - kubelet.sock created (the kubelet restarted): re-serve and register, unless this loop is
//   already registered with that very socket (it saw it first another way);
// - our socket removed while we serve (the kubelet wiped the directory): re-serve; register with
//   the kubelet whose socket is there;
// - the directory itself removed or replaced (`rm -rf` and re-create, IN_IGNORED): re-arm the
//   watch on the new directory, then the same;
// - lost inotify events (IN_Q_OVERFLOW): judge by the state of the directory instead;
// - the ListAndWatch stream of the current registration ended by the kubelet while its socket is
//   the same: register again after a bounded backoff, having ended older registrations' streams
//   (the kubelet disconnects whichever client is current when any stream ends);
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

// Which kubelet a kubelet.sock belongs to: a restarted kubelet removes the file and creates it
// again, and a new file may reuse the old inode number, so its birth time (statx STATX_BTIME;
// the change time where the file system keeps none) tells the two apart.
struct SocketId {
  dev_t dev = 0;
  ino_t ino = 0;
  std::int64_t born_ns = 0;
  bool operator==(const SocketId&) const = default;
};
std::optional<SocketId> socket_id(const std::filesystem::path& path);

// What the streams did since the registration loop last asked.
struct StreamNews {
  bool lost = false;         // the current registration's last stream was ended by the kubelet
  bool other_ended = false;  // another stream was ended by the kubelet (see RegistrationLoop)
};

// Which ListAndWatch streams belong to which registration (pure; plugin.cpp holds one under its
// lock). A registration starts before Register is sent: the kubelet may open the stream before
// Register returns. A stream counts for the registration current when it opened. When the last
// stream of the current registration ends and not by our own doing, the registration is lost; an
// older registration's stream ending never counts as that.
class StreamLedger {
 public:
  // A new registration; every stream open now is from now on an older registration's.
  void begin_registration();
  std::uint64_t registration() const { return m_registration; }
  // A stream opened; returns the registration it belongs to.
  std::uint64_t opened();
  // The stream of `registration` ended; `ours`: we ended it (server stop, retirement). True when
  // there is news for the loop (take_news).
  bool closed(std::uint64_t registration, bool ours);
  StreamNews take_news();
  // Every stream of a registration up to the current one should end now (see retired()).
  void retire_all() { m_retire_below = m_registration + 1; }
  bool retired(std::uint64_t registration) const { return registration < m_retire_below; }
  int open_current() const { return m_open_current; }

 private:
  std::uint64_t m_registration = 0;
  std::uint64_t m_retire_below = 0;
  int m_open_current = 0;
  StreamNews m_news;
};

// The seams the loop drives: the gRPC server and the Register call live in plugin.cpp.
struct RegistrationHooks {
  std::function<Status()> serve;         // start serving on the plugin socket
  std::function<void()> stop_serving;    // stop, end every stream, remove the socket
  std::function<Status()> register_now;  // Register with the kubelet (and log and count it)
  // Since when no ListAndWatch stream has been open; nullopt while one is.
  std::function<std::optional<std::chrono::steady_clock::time_point>()> streams_idle_since;
  // What the streams did since the last call (StreamLedger::take_news); the plugin calls
  // RegistrationLoop::wake when there is news.
  std::function<StreamNews()> take_stream_news;
  // End every stream still open on behalf of a registration up to the current one, so that the
  // kubelet handles their end before the next Register and not after it.
  std::function<void()> retire_streams;
  // Send the device list again on every open stream.
  std::function<void()> resend_devices;
};

struct RegistrationSettings {
  std::filesystem::path plugin_dir;
  std::string kubelet_socket = "kubelet.sock";
  std::string own_socket;
  // nullopt: never re-register for want of a stream.
  std::optional<std::chrono::milliseconds> reregister_after;
  std::chrono::milliseconds retry = std::chrono::seconds(1);
  // Registering again after the kubelet ended the current registration's stream: the first wait,
  // doubled on each loss in a row up to `lost_backoff_max`; back to the first after a
  // registration that held for `lost_backoff_reset`. The first wait also separates the end of
  // our old streams from the next Register when we re-serve for the same kubelet.
  std::chrono::milliseconds lost_backoff = std::chrono::milliseconds(250);
  std::chrono::milliseconds lost_backoff_max = std::chrono::seconds(8);
  std::chrono::milliseconds lost_backoff_reset = std::chrono::seconds(30);
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
  // Wakes run() to look at the hooks again (thread-safe; the plugin calls it when a stream ends).
  void wake();

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
  void check_stream_news();
  void resend_when_due();
  // Stop serving and register afresh, after `settle` (zero: at once).
  void restart(std::string_view why,
               std::chrono::milliseconds settle = std::chrono::milliseconds(0));
  bool registered_with_current_kubelet() const;
  std::optional<SocketId> registered_socket(std::optional<SocketId> seen) const;
  int poll_timeout_ms() const;
  std::optional<DirId> identity(const std::filesystem::path& p) const;

  RegistrationSettings m_cfg;
  RegistrationHooks m_hooks;
  Logger& m_log;
  PluginMetrics& m_metrics;
  std::string m_kubelet_path, m_own_path;
  int m_inotify = -1;
  int m_wake = -1;                               // an eventfd: wake()
  int m_watch = -1;                              // -1 while the directory is not watched
  std::optional<DirId> m_dir_id;                 // the directory the watch is on
  std::optional<SocketId> m_registered_kubelet;  // kubelet.sock when we last registered
  std::chrono::milliseconds m_lost_backoff{0};   // the next wait after a lost stream
  // When to send the device list again: the kubelet may have marked the devices unhealthy on
  // the end of a stream that was not the current one (see check_stream_news).
  std::optional<std::chrono::steady_clock::time_point> m_resend_at;
  bool m_dir_missing_logged = false;
  bool m_serving = false;
  std::atomic<bool> m_registered{false};
  bool m_waiting_logged = false;
  std::chrono::steady_clock::time_point m_registered_at{};
  std::chrono::steady_clock::time_point m_retry_at{};
};

}  // namespace gpufence
