#include "deviceplugin/registration.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace gpufence {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr uint32_t kWatchMask = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM |
                                IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;

std::string ms_text(Clock::duration d) {
  return cat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count(), "ms");
}

}  // namespace

DirEvents parse_dir_events(std::span<const char> buffer, int wd, std::string_view kubelet_socket,
                           std::string_view own_socket) {
  DirEvents out;
  size_t offset = 0;
  while (offset + sizeof(inotify_event) <= buffer.size()) {
    inotify_event ev;
    std::memcpy(&ev, buffer.data() + offset, sizeof ev);
    size_t next = offset + sizeof(inotify_event) + ev.len;
    if (next > buffer.size()) break;  // a truncated record: read(2) never returns one
    const char* name_at = buffer.data() + offset + sizeof(inotify_event);
    std::string_view name(name_at, ev.len ? ::strnlen(name_at, ev.len) : 0);
    offset = next;
    if (ev.mask & IN_Q_OVERFLOW) out.overflowed = true;  // wd is -1 on this one
    if (ev.wd != wd) continue;
    if (ev.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT)) out.watch_lost = true;
    if (name == kubelet_socket && (ev.mask & (IN_CREATE | IN_MOVED_TO)))
      out.kubelet_socket_created = true;
    if (name == own_socket && (ev.mask & (IN_DELETE | IN_MOVED_FROM)))
      out.own_socket_removed = true;
  }
  return out;
}

std::optional<SocketId> socket_id(const std::filesystem::path& path) {
  struct statx sx {};
  if (::statx(AT_FDCWD, path.c_str(), 0, STATX_INO | STATX_BTIME | STATX_CTIME, &sx) != 0)
    return std::nullopt;
  const auto& born = (sx.stx_mask & STATX_BTIME) ? sx.stx_btime : sx.stx_ctime;
  return SocketId{makedev(sx.stx_dev_major, sx.stx_dev_minor), static_cast<ino_t>(sx.stx_ino),
                  static_cast<std::int64_t>(born.tv_sec) * 1'000'000'000 + born.tv_nsec};
}

void StreamLedger::begin_registration() {
  ++m_registration;
  m_open_current = 0;
  m_news.lost = false;  // a loss of the registration this one replaces is moot
}

std::uint64_t StreamLedger::opened() {
  ++m_open_current;
  return m_registration;
}

bool StreamLedger::closed(std::uint64_t registration, bool ours) {
  const bool current = registration == m_registration;
  if (current && m_open_current > 0) --m_open_current;
  if (ours) return false;
  if (current && m_open_current == 0) {
    m_news.lost = true;
  } else {
    m_news.other_ended = true;
  }
  return true;
}

StreamNews StreamLedger::take_news() {
  return std::exchange(m_news, StreamNews{});
}

RegistrationLoop::RegistrationLoop(RegistrationSettings settings, RegistrationHooks hooks,
                                   Logger& log, PluginMetrics& metrics)
    : m_cfg(std::move(settings)),
      m_hooks(std::move(hooks)),
      m_log(log),
      m_metrics(metrics),
      m_kubelet_path((m_cfg.plugin_dir / m_cfg.kubelet_socket).string()),
      m_own_path((m_cfg.plugin_dir / m_cfg.own_socket).string()),
      m_wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      m_lost_backoff(m_cfg.lost_backoff) {}

RegistrationLoop::~RegistrationLoop() {
  if (m_inotify >= 0) ::close(m_inotify);
  if (m_wake >= 0) ::close(m_wake);
}

void RegistrationLoop::wake() {
  std::uint64_t one = 1;
  if (m_wake >= 0) [[maybe_unused]]
    auto n = ::write(m_wake, &one, sizeof one);
}

// Which kubelet.sock the Register that just succeeded went to: the one there now. A live kubelet
// answered it, and a starting kubelet replaces the socket of one that has exited (whose socket
// refuses connections), so a socket replaced during the call, after our look at it (`seen`), is
// the one that answered: its IN_CREATE is then no new kubelet (a second Register would be; seen on
// a real kubelet in about 1 of 40 restarts). Were it the old kubelet after all (two alive at
// once), the old one's stream ends as it exits, and that loss registers again with the new one
// (check_stream_news).
std::optional<SocketId> RegistrationLoop::registered_socket(std::optional<SocketId> seen) const {
  auto now = socket_id(m_kubelet_path);
  return now ? now : seen;
}

bool RegistrationLoop::registered_with_current_kubelet() const {
  auto kubelet = socket_id(m_kubelet_path);
  return m_registered && kubelet && m_registered_kubelet && *kubelet == *m_registered_kubelet;
}

int RegistrationLoop::poll_timeout_ms() const {
  auto until = [](Clock::time_point t) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(ms, 0, 200));
  };
  // Quick rounds while something is pending (sooner when a retry is due before then); when all
  // is well, wake only for the stream checks. A retry already due is waiting for something else
  // (the kubelet's socket, the directory): the next quick round.
  if (!m_registered || m_watch < 0) {
    auto next_round = Clock::now() + 200ms;
    return until(m_retry_at > Clock::now() ? std::min(m_retry_at, next_round) : next_round);
  }
  if (m_resend_at) return until(*m_resend_at);
  return m_cfg.reregister_after ? 1000 : -1;
}

std::optional<RegistrationLoop::DirId> RegistrationLoop::identity(
    const std::filesystem::path& p) const {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return DirId{st.st_dev, st.st_ino, st.st_nlink};
}

Status RegistrationLoop::run(int stop_fd) {
  std::error_code ec;
  std::filesystem::create_directories(m_cfg.plugin_dir, ec);
  m_inotify = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (m_inotify < 0) return fail_errno("inotify_init1 for", m_cfg.plugin_dir.native());
  if (auto st = arm_watch(); !st) return st;

  Status result;
  while (true) {
    // Re-arm first: nothing below can be trusted while the directory is not watched.
    if (m_watch < 0) {
      if (auto st = arm_watch(); !st && st.error().code == Errc::denied) {
        result = st;
        break;
      }
    } else if (auto st = check_not_deleted(); !st) {
      result = st;
      break;
    }
    check_stream_news();
    try_register();
    check_streams();
    resend_when_due();

    pollfd fds[3] = {{stop_fd, POLLIN, 0}, {m_inotify, POLLIN, 0}, {m_wake, POLLIN, 0}};
    if (::poll(fds, 3, poll_timeout_ms()) < 0 && errno != EINTR) {
      result = fail_errno("poll", m_cfg.plugin_dir.native());
      break;
    }
    if (fds[0].revents) break;
    if (fds[2].revents & POLLIN) {
      std::uint64_t count;
      [[maybe_unused]] auto n = ::read(m_wake, &count, sizeof count);
    }
    if (fds[1].revents & POLLIN) {
      if (auto st = handle_events(); !st) {
        result = st;
        break;
      }
    }
  }
  if (m_serving) m_hooks.stop_serving();
  m_serving = false;
  m_registered = false;
  return result;
}

Status RegistrationLoop::arm_watch() {
  auto id = identity(m_cfg.plugin_dir);
  if (!id) {
    if (!m_dir_missing_logged)
      m_log.warn("plugin.dir_missing", {{"dir", m_cfg.plugin_dir.native()}, {"retry", "200ms"}});
    m_dir_missing_logged = true;
    return fail(Errc::not_found, "plugin directory ", m_cfg.plugin_dir.native(), " is missing");
  }
  if (auto st = check_not_deleted(); !st) return st;
  m_watch = ::inotify_add_watch(m_inotify, m_cfg.plugin_dir.c_str(), kWatchMask);
  if (m_watch < 0) return fail_errno("inotify_add_watch", m_cfg.plugin_dir.native());
  if (m_dir_id) m_log.info("plugin.dir_rewatched", {{"dir", m_cfg.plugin_dir.native()}});
  m_dir_id = id;
  m_dir_missing_logged = false;
  return {};
}

Status RegistrationLoop::check_not_deleted() const {
  auto id = identity(m_cfg.plugin_dir);
  if (!id || id->links > 0) return {};
  // The directory was deleted, yet its path still leads to it: this process sees the host's
  // directory through a bind mount (a hostPath volume), which keeps the deleted inode and can
  // never show the kubelet's new one. No inotify event says so: the mount holds the inode, so
  // IN_DELETE_SELF/IN_IGNORED wait for the unmount. Only a container restart re-resolves the
  // hostPath.
  return fail(Errc::denied, "plugin directory ", m_cfg.plugin_dir.native(),
              " was deleted and this mount cannot see its replacement; exiting so the "
              "container restarts with the new directory");
}

void RegistrationLoop::try_register() {
  auto now = Clock::now();
  if (m_registered || now < m_retry_at || m_watch < 0) return;
  auto kubelet = socket_id(m_kubelet_path);
  if (!kubelet) {
    if (!m_waiting_logged) m_log.info("plugin.waiting_for_kubelet", {{"socket", m_kubelet_path}});
    m_waiting_logged = true;
    return;
  }
  m_waiting_logged = false;
  std::error_code ec;
  if (m_serving && !std::filesystem::exists(m_own_path, ec)) {
    // Our socket is gone (a starting kubelet wipes the directory): the kubelet could not dial it.
    m_log.debug("plugin.restart", {{"why", "plugin socket gone before Register"}});
    m_hooks.stop_serving();
    m_serving = false;
  }
  Status st = m_serving ? Status{} : m_hooks.serve();
  if (st) m_serving = true;
  if (st) st = m_hooks.register_now();
  if (st) {
    m_registered = true;
    m_registered_at = Clock::now();
    m_registered_kubelet = registered_socket(kubelet);
    // Our own stop of an older server ends streams the kubelet handles after this Register; a
    // kubelet that keeps one client per socket then marks the devices unhealthy while our new
    // stream is open. The list again, a little later, undoes that.
    m_resend_at = m_registered_at + m_cfg.lost_backoff;
    return;
  }
  m_log.warn("plugin.register_failed",
             {{"error", st.error().message}, {"retry_in", ms_text(m_cfg.retry)}});
  if (m_serving) m_hooks.stop_serving();
  m_serving = false;
  m_retry_at = Clock::now() + m_cfg.retry;
}

Status RegistrationLoop::handle_events() {
  DirEvents events;
  alignas(inotify_event) char buf[8192];
  ssize_t n;
  while ((n = ::read(m_inotify, buf, sizeof buf)) > 0) {
    auto more = parse_dir_events({buf, static_cast<size_t>(n)}, m_watch, m_cfg.kubelet_socket,
                                 m_cfg.own_socket);
    events.kubelet_socket_created |= more.kubelet_socket_created;
    events.own_socket_removed |= more.own_socket_removed;
    events.watch_lost |= more.watch_lost;
    events.overflowed |= more.overflowed;
  }
  std::error_code ec;
  if (events.watch_lost) {
    // rm -rf of the directory (or a rename): the watch is gone with it; whatever sockets were in
    // it are gone too. Watch the path again and start over.
    ::inotify_rm_watch(m_inotify, m_watch);  // already gone after IN_IGNORED; harmless
    m_watch = -1;
    m_log.warn("plugin.dir_removed", {{"dir", m_cfg.plugin_dir.native()}});
    restart("plugin directory removed or replaced");
    return {};
  }
  if (events.overflowed) {
    // Events were dropped: judge by what is there now.
    auto kubelet = socket_id(m_kubelet_path);
    bool kubelet_changed =
        m_registered && kubelet && m_registered_kubelet && !(*kubelet == *m_registered_kubelet);
    bool socket_gone = m_serving && !std::filesystem::exists(m_own_path, ec);
    m_log.warn("plugin.inotify_overflow", {{"kubelet_changed", kubelet_changed ? "true" : "false"},
                                           {"socket_gone", socket_gone ? "true" : "false"}});
    if (kubelet_changed || socket_gone) restart("inotify overflow and the directory changed");
    return {};
  }
  if (events.kubelet_socket_created) {
    if (registered_with_current_kubelet()) {
      // Registered with this very socket already (found when our own socket went, before this
      // event was read): a second Register would make the kubelet replace its client, and the
      // end of the first one's stream would then disconnect the second.
      m_log.debug("plugin.kubelet_seen",
                  {{"socket", m_kubelet_path}, {"why", "already registered with it"}});
      return {};
    }
    m_metrics.count_kubelet_restart();
    m_log.info("plugin.kubelet_restarted", {{"socket", m_kubelet_path}});
    m_lost_backoff = m_cfg.lost_backoff;
    restart("kubelet restarted");
  } else if (events.own_socket_removed && m_serving && !std::filesystem::exists(m_own_path, ec)) {
    // Judge by the state now, not by the event: our own stop/start and gRPC itself unlink this
    // path too. Only a socket gone from under a running server means someone wiped it: a
    // starting kubelet (its socket is gone or new), or someone else under the same kubelet, which
    // handles the end of our old stream some time after we stop serving; wait a little before
    // registering again, so that it does not take our new client for the old.
    m_log.info("plugin.socket_removed", {{"socket", m_own_path}});
    bool same_kubelet = registered_with_current_kubelet();
    restart("plugin socket removed", same_kubelet ? m_cfg.lost_backoff : 0ms);
  }
  return {};
}

void RegistrationLoop::check_streams() {
  if (!m_registered || !m_cfg.reregister_after || !m_hooks.streams_idle_since) return;
  auto idle = m_hooks.streams_idle_since();
  if (!idle) return;
  auto since = std::max(*idle, m_registered_at);
  auto now = Clock::now();
  if (now - since < *m_cfg.reregister_after) return;
  m_log.warn("plugin.no_stream", {{"for", ms_text(now - since)}, {"action", "re-register"}});
  // The server is fine; the kubelet forgot us. Registering again makes it dial us back. If the
  // socket is gone after all, that Register fails and the retry serves afresh.
  m_registered = false;
  m_retry_at = now;
}

void RegistrationLoop::check_stream_news() {
  if (!m_hooks.take_stream_news) return;
  auto news = m_hooks.take_stream_news();
  auto now = Clock::now();
  if (news.other_ended && m_registered) {
    // A stream of ours that is not the current registration's last ended by the kubelet's hand.
    // A kubelet that keeps one client per socket path disconnects that client and marks every
    // device of the resource unhealthy, though our current stream is still open; the list again,
    // once it has handled that, makes them healthy.
    m_resend_at = now + m_cfg.lost_backoff;
  }
  if (!news.lost || !m_registered) return;
  // The kubelet ended the stream of the current registration. Its runClient disconnects the
  // client current for the resource name whenever any client's stream ends, so an older
  // registration's stream ending after a newer Register takes the newer one down with it.
  auto kubelet = socket_id(m_kubelet_path);
  if (m_hooks.retire_streams) m_hooks.retire_streams();
  m_registered = false;
  if (!kubelet || !m_registered_kubelet || !(*kubelet == *m_registered_kubelet)) {
    // That kubelet is gone; its successor's socket brings the next registration (once).
    m_log.info("plugin.kubelet_gone", {{"socket", m_kubelet_path}});
    m_retry_at = now;
    return;
  }
  if (now - m_registered_at >= m_cfg.lost_backoff_reset) m_lost_backoff = m_cfg.lost_backoff;
  auto wait = m_lost_backoff;
  m_lost_backoff = std::min(m_lost_backoff * 2, m_cfg.lost_backoff_max);
  m_retry_at = now + wait;
  m_log.warn("plugin.no_stream", {{"why", "the kubelet ended the current registration's stream"},
                                  {"action", "re-register"},
                                  {"retry_in", ms_text(wait)}});
}

void RegistrationLoop::resend_when_due() {
  if (!m_resend_at || Clock::now() < *m_resend_at) return;
  m_resend_at.reset();
  if (!m_registered || !m_hooks.resend_devices) return;
  m_log.debug("plugin.resend_devices", {});
  m_hooks.resend_devices();
}

void RegistrationLoop::restart(std::string_view why, std::chrono::milliseconds settle) {
  if (m_serving) {
    m_log.debug("plugin.restart", {{"why", std::string(why)}});
    m_hooks.stop_serving();
  }
  m_serving = false;
  m_registered = false;
  m_retry_at = Clock::now() + settle;
}

}  // namespace gpufence
