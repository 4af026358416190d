// RegistrationLoop on a real directory with fake server hooks, and the inotify record parser on
// literal records.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>

#include "deviceplugin/registration.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;
using gpufence::test::eventually;

namespace {

void append_event(std::string& buf, int wd, uint32_t mask, std::string_view name) {
  size_t len = name.empty() ? 0 : (name.size() + 1 + 7) / 8 * 8;  // NUL-padded, as the kernel does
  inotify_event ev{};
  ev.wd = wd;
  ev.mask = mask;
  ev.len = static_cast<uint32_t>(len);
  buf.append(reinterpret_cast<const char*>(&ev), sizeof ev);
  std::string padded(name);
  padded.resize(len, '\0');
  buf += padded;
}

DirEvents parse(const std::string& buf, int wd = 1) {
  return parse_dir_events({buf.data(), buf.size()}, wd, "kubelet.sock", "plugin.sock");
}

// Runs a RegistrationLoop on a thread with hooks that stand in for the gRPC server: serving
// creates the socket file, stopping removes it, Register counts.
class LoopFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    m_plugin_dir = m_dir / "device-plugins";
    std::filesystem::create_directories(m_plugin_dir);
    m_stop = ::eventfd(0, EFD_CLOEXEC);
  }
  void TearDown() override {
    stop();
    ::close(m_stop);
  }
  void start(std::optional<std::chrono::milliseconds> reregister_after = std::nullopt) {
    RegistrationSettings cfg;
    cfg.plugin_dir = m_plugin_dir;
    cfg.own_socket = "plugin.sock";
    cfg.reregister_after = reregister_after;
    cfg.retry = 50ms;
    cfg.lost_backoff = m_lost_backoff;
    cfg.lost_backoff_max = 4 * m_lost_backoff;
    RegistrationHooks hooks{
        .serve =
            [this] {
              std::ofstream(m_plugin_dir / "plugin.sock") << "";
              // A kubelet starts after the loop looked at its socket, before the dial.
              if (m_kubelet_starts_on_serve.exchange(false)) kubelet_starts();
              return Status{};
            },
        .stop_serving =
            [this] {
              std::error_code ec;
              std::filesystem::remove(m_plugin_dir / "plugin.sock", ec);
              // The new kubelet's socket appears right now: after the loop read the event that
              // made it stop serving, before it reads this one's.
              if (m_kubelet_starts_on_stop.exchange(false)) kubelet_starts();
            },
        .register_now =
            [this] {
              // The kubelet's socket replaced while Register is in flight: the new kubelet is
              // the one that answers (the old one's socket refuses connections).
              if (m_kubelet_starts_on_register.exchange(false)) kubelet_starts();
              std::lock_guard lock(m_mu);
              m_register_times.push_back(std::chrono::steady_clock::now());
              ++m_registrations;
              return Status{};
            },
        .streams_idle_since = [this]() -> std::optional<std::chrono::steady_clock::time_point> {
          if (m_stream_open) return std::nullopt;
          return std::chrono::steady_clock::time_point{};
        },
        .take_stream_news =
            [this] {
              std::lock_guard lock(m_mu);
              return std::exchange(m_news, StreamNews{});
            },
        .retire_streams = [this] { ++m_retirements; },
        .resend_devices = [this] { ++m_resends; },
    };
    m_loop = std::make_unique<RegistrationLoop>(cfg, hooks, m_log, m_metrics);
    m_thread = std::thread([this] { m_result = m_loop->run(m_stop); });
  }
  // The kubelet ended the current registration's last stream.
  void stream_lost() {
    {
      std::lock_guard lock(m_mu);
      m_news.lost = true;
    }
    m_loop->wake();
  }
  std::chrono::steady_clock::time_point registered_at(size_t i) {
    std::lock_guard lock(m_mu);
    return m_register_times.at(i);
  }
  bool log_has(const std::string& needle) {
    std::ifstream in(m_log_path);
    return std::string(std::istreambuf_iterator<char>(in), {}).find(needle) != std::string::npos;
  }
  void log_to_file() {
    m_log_path = m_dir / "loop.log";
    m_log.set_level(LogLevel::debug);
    ASSERT_TRUE(m_log.open_file(m_log_path.string()));
  }
  void stop() {
    if (!m_thread.joinable()) return;
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(m_stop, &one, sizeof one);
    m_thread.join();
  }
  void registers_once_then_again_for_a_new_kubelet() {
    EXPECT_TRUE(eventually([&] { return log_has("event=plugin.kubelet_seen"); }))
        << "the new socket's IN_CREATE was read after registering with it";
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(m_registrations, 1) << "one Register per kubelet";
    kubelet_starts();  // after the Register: a new kubelet
    ASSERT_TRUE(eventually([&] { return m_registrations == 2; }));
  }
  void kubelet_starts() {
    std::error_code ec;
    std::filesystem::remove(m_plugin_dir / "kubelet.sock", ec);
    std::ofstream(m_plugin_dir / "kubelet.sock") << "";
  }

  test::TempDir m_dir;
  std::filesystem::path m_plugin_dir;
  Logger m_log{LogLevel::off};
  PluginMetrics m_metrics;
  int m_stop = -1;
  std::atomic<int> m_registrations{0};
  std::atomic<bool> m_stream_open{true};
  std::atomic<bool> m_kubelet_starts_on_stop{false}, m_kubelet_starts_on_serve{false},
      m_kubelet_starts_on_register{false};
  std::atomic<int> m_retirements{0}, m_resends{0};
  std::chrono::milliseconds m_lost_backoff = 100ms;
  std::mutex m_mu;
  StreamNews m_news;
  std::vector<std::chrono::steady_clock::time_point> m_register_times;
  std::filesystem::path m_log_path;
  std::unique_ptr<RegistrationLoop> m_loop;
  std::thread m_thread;
  Status m_result;
};

}  // namespace

TEST(DirEvents, ReadsEachKindOfRecord) {
  std::string buf;
  append_event(buf, 1, IN_CREATE, "kubelet.sock");
  auto created = parse(buf);
  EXPECT_TRUE(created.kubelet_socket_created);
  EXPECT_FALSE(created.watch_lost);

  buf.clear();
  append_event(buf, 1, IN_DELETE, "plugin.sock");
  append_event(buf, 1, IN_CREATE, "other.sock");
  auto removed = parse(buf);
  EXPECT_TRUE(removed.own_socket_removed);
  EXPECT_FALSE(removed.kubelet_socket_created);

  buf.clear();
  append_event(buf, 1, IN_DELETE_SELF, "");
  append_event(buf, 1, IN_IGNORED, "");
  EXPECT_TRUE(parse(buf).watch_lost) << "rm -rf of the directory";

  buf.clear();
  append_event(buf, 0, IN_IGNORED, "");
  append_event(buf, 0, IN_CREATE, "kubelet.sock");
  auto stale = parse(buf);
  EXPECT_FALSE(stale.watch_lost) << "the last word of a watch already replaced";
  EXPECT_FALSE(stale.kubelet_socket_created);

  buf.clear();
  append_event(buf, -1, IN_Q_OVERFLOW, "");
  EXPECT_TRUE(parse(buf).overflowed);

  buf.clear();
  append_event(buf, 1, IN_MOVED_TO, "kubelet.sock");
  buf.resize(buf.size() - 4);  // truncated: ignored, not read past the end
  EXPECT_FALSE(parse(buf).kubelet_socket_created);
}

// CPU time this process has used so far.
std::chrono::microseconds cpu_used() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) {
    return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec);
  };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

TEST_F(LoopFixture, WaitsForTheKubeletThenRegistersOnce) {
  start();
  auto cpu_before = cpu_used();
  std::this_thread::sleep_for(300ms);  // no kubelet for a while: nothing registers
  EXPECT_LT(cpu_used() - cpu_before, 100ms) << "waiting is a poll, not a spin";
  EXPECT_EQ(m_registrations, 0);
  kubelet_starts();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  EXPECT_TRUE(m_loop->registered());
  EXPECT_TRUE(std::filesystem::exists(m_plugin_dir / "plugin.sock"));
  stop();
  EXPECT_TRUE(m_result);
  EXPECT_FALSE(std::filesystem::exists(m_plugin_dir / "plugin.sock")) << "stop stops serving";
}

// A starting kubelet wipes the directory, then creates its socket. When the loop finds that
// socket while re-serving for the wipe (before it reads the socket's IN_CREATE), it registers
// once: the IN_CREATE of the socket it registered with is no second kubelet. (It registered
// twice, and the real kubelet's handling of the first client's stream end then disconnected the
// second: allocatable 0 for 30 s.)
TEST_F(LoopFixture, RegistersOncePerKubeletWhenItFindsTheSocketBeforeItsCreateEvent) {
  log_to_file();
  kubelet_starts();
  start();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  m_kubelet_starts_on_stop = true;
  std::filesystem::remove(m_plugin_dir / "kubelet.sock");  // the wipe: the old socket first,
  std::filesystem::remove(m_plugin_dir / "plugin.sock");   // then ours
  EXPECT_TRUE(eventually([&] { return log_has("event=plugin.kubelet_seen"); }))
      << "the new socket's IN_CREATE was read after registering with it";
  EXPECT_EQ(m_registrations, 2) << "one Register per kubelet";
  EXPECT_TRUE(m_loop->registered());
  EXPECT_TRUE(std::filesystem::exists(m_plugin_dir / "plugin.sock"));
  kubelet_starts();  // a later restart is a new kubelet all the same
  ASSERT_TRUE(eventually([&] { return m_registrations == 3; }));
}

// The kubelet's socket replaced between the loop's look at it and its Register, or while the
// Register is in flight (a kubelet starting while the plugin re-serves): the Register reached the
// new socket, so its IN_CREATE is no new kubelet. (Seen on a real kubelet: a second Register in
// about 1 of 40 restarts.) A socket replaced after the Register is a new kubelet all the same.
TEST_F(LoopFixture, ASocketReplacedBeforeTheDialIsTheOneRegisteredWith) {
  log_to_file();
  kubelet_starts();
  m_kubelet_starts_on_serve = true;
  start();
  registers_once_then_again_for_a_new_kubelet();
}

TEST_F(LoopFixture, ASocketReplacedDuringTheRegisterIsTheOneRegisteredWith) {
  log_to_file();
  kubelet_starts();
  m_kubelet_starts_on_register = true;
  start();
  registers_once_then_again_for_a_new_kubelet();
}

// The kubelet ended the stream of the current registration while its socket is the same: the
// older registrations' streams are ended first, then Register again after a backoff that doubles
// on each loss in a row, up to its bound.
TEST_F(LoopFixture, ReRegistersWithABoundedBackoffWhenTheKubeletEndsTheCurrentStream) {
  kubelet_starts();
  start();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  for (int i = 1; i <= 4; ++i) {
    auto lost_at = std::chrono::steady_clock::now();
    stream_lost();
    ASSERT_TRUE(eventually([&] { return m_registrations == i + 1; })) << "loss " << i;
    auto waited = registered_at(static_cast<size_t>(i)) - lost_at;
    auto backoff = std::min(m_lost_backoff * (1 << (i - 1)), 4 * m_lost_backoff);
    EXPECT_GE(waited, backoff) << "loss " << i;
    EXPECT_EQ(m_retirements, i) << "older streams end before the next Register";
  }
}

// A stream that was not the current registration's last, ended by the kubelet: no new Register,
// but the device list again a little later (a kubelet may have marked the devices unhealthy).
TEST_F(LoopFixture, AnotherStreamEndingSendsTheListAgainAndRegistersNothing) {
  kubelet_starts();
  start();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1 && m_resends == 1; }))
      << "once after each Register";
  {
    std::lock_guard lock(m_mu);
    m_news.other_ended = true;
  }
  m_loop->wake();
  ASSERT_TRUE(eventually([&] { return m_resends == 2; }));
  EXPECT_EQ(m_registrations, 1);
  EXPECT_EQ(m_retirements, 0);
}

// Which registration a stream belongs to, and what its end means.
TEST(StreamLedger, OnlyTheCurrentRegistrationsLastStreamEndingIsALoss) {
  StreamLedger ledger;
  ledger.begin_registration();
  auto first = ledger.opened();
  ledger.begin_registration();  // a second Register while the first one's stream is open
  auto second = ledger.opened();
  auto third = ledger.opened();  // the kubelet opened two for it
  EXPECT_NE(first, second);
  EXPECT_EQ(second, third);

  EXPECT_TRUE(ledger.closed(first, false));
  auto news = ledger.take_news();
  EXPECT_FALSE(news.lost) << "an older registration's stream ending is not the current one's";
  EXPECT_TRUE(news.other_ended);

  EXPECT_TRUE(ledger.closed(second, false));
  news = ledger.take_news();
  EXPECT_FALSE(news.lost) << "the current registration still has a stream";
  EXPECT_TRUE(news.other_ended);

  EXPECT_TRUE(ledger.closed(third, false));
  EXPECT_TRUE(ledger.take_news().lost);
  EXPECT_FALSE(ledger.take_news().lost) << "news is taken once";

  ledger.begin_registration();
  auto fourth = ledger.opened();
  EXPECT_FALSE(ledger.closed(fourth, true)) << "a stream we ended is no news";
  EXPECT_FALSE(ledger.take_news().lost);

  auto fifth = ledger.opened();
  ledger.retire_all();
  EXPECT_TRUE(ledger.retired(fifth));
  EXPECT_TRUE(ledger.retired(first));
  ledger.begin_registration();
  EXPECT_FALSE(ledger.retired(ledger.opened()));

  ledger.begin_registration();
  auto sixth = ledger.opened();
  ledger.closed(sixth, false);
  ledger.begin_registration();  // registered again before the loop looked
  EXPECT_FALSE(ledger.take_news().lost) << "the loss of a replaced registration is moot";
}

// A kubelet.sock is told from its successor (here one that existed beside it, so never the same
// inode; a reused inode number differs in its birth time) and is gone with its file.
TEST(SocketId, TellsARecreatedSocketFromTheOld) {
  test::TempDir dir;
  auto path = dir / "kubelet.sock";
  std::ofstream(path) << "";
  auto a = socket_id(path);
  ASSERT_TRUE(a);
  EXPECT_EQ(socket_id(path), a) << "the same file";
  std::ofstream(dir / "next.sock") << "";
  std::filesystem::rename(dir / "next.sock", path);
  auto b = socket_id(path);
  ASSERT_TRUE(b);
  EXPECT_NE(*a, *b);
  std::filesystem::remove(path);
  EXPECT_FALSE(socket_id(path));
}

TEST_F(LoopFixture, ReArmsOnARecreatedDirectoryAndStillSeesKubeletRestarts) {
  kubelet_starts();
  start();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  // The kubelet stops (its socket goes first), then the directory is removed and re-created.
  std::filesystem::remove(m_plugin_dir / "kubelet.sock");
  std::filesystem::remove_all(m_plugin_dir);
  std::filesystem::create_directories(m_plugin_dir);
  kubelet_starts();
  // Registered again, serving in the new directory (perhaps twice over: once before the old
  // watch's IN_IGNORED is read, once after re-arming).
  ASSERT_TRUE(eventually([&] {
    return m_registrations >= 2 && m_loop->registered() &&
           std::filesystem::exists(m_plugin_dir / "plugin.sock");
  }));
  std::this_thread::sleep_for(300ms);  // let the old watch's last events drain
  int before = m_registrations;
  kubelet_starts();  // a kubelet restart, seen only through the new watch
  ASSERT_TRUE(eventually([&] { return m_registrations > before; }));
}

TEST_F(LoopFixture, ReRegistersWhenNoStreamIsOpenForTheConfiguredTime) {
  kubelet_starts();
  m_stream_open = false;
  start(100ms);
  ASSERT_TRUE(eventually([&] { return m_registrations >= 2; }));
}

TEST_F(LoopFixture, NeverReRegistersForWantOfAStreamWhenTheFlagIsOff) {
  kubelet_starts();
  start();  // no re-registration for want of a stream: reregister_after is off
  m_stream_open = false;
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(m_registrations, 1);
}

TEST_F(LoopFixture, ExitsWhenTheDirectoryIsDeletedUnderABindMount) {
  // A pod's hostPath volume: the plugin sees the host directory through a bind mount.
  auto host_dir = m_dir / "host-device-plugins";
  std::filesystem::create_directories(host_dir);
  if (::mount(host_dir.c_str(), m_plugin_dir.c_str(), nullptr, MS_BIND, nullptr) != 0)
    GTEST_SKIP() << "bind mount needs CAP_SYS_ADMIN: " << std::strerror(errno);
  struct Unmount {
    std::filesystem::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{m_plugin_dir};
  kubelet_starts();
  start();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  std::filesystem::remove_all(host_dir);  // the host's rm -rf
  std::filesystem::create_directories(host_dir);
  ASSERT_TRUE(eventually([&] { return !m_loop->registered(); }));
  m_thread.join();  // run() returned by itself
  ASSERT_FALSE(m_result);
  EXPECT_EQ(m_result.error().code, Errc::denied);
  EXPECT_NE(m_result.error().message.find("was deleted and this mount cannot see its replacement"),
            std::string::npos)
      << m_result.error().message;
}
