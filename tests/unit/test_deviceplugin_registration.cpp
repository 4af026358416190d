// RegistrationLoop on a real directory with fake server hooks, and the inotify record parser on
// literal records.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "deviceplugin/registration.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

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

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 5s) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
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
    RegistrationHooks hooks{
        .serve =
            [this] {
              std::ofstream(m_plugin_dir / "plugin.sock") << "";
              return Status{};
            },
        .stop_serving =
            [this] {
              std::error_code ec;
              std::filesystem::remove(m_plugin_dir / "plugin.sock", ec);
            },
        .register_now =
            [this] {
              ++m_registrations;
              return Status{};
            },
        .streams_idle_since = [this]() -> std::optional<std::chrono::steady_clock::time_point> {
          if (m_stream_open) return std::nullopt;
          return std::chrono::steady_clock::time_point{};
        },
    };
    m_loop = std::make_unique<RegistrationLoop>(cfg, hooks, m_log, m_metrics);
    m_thread = std::thread([this] { m_result = m_loop->run(m_stop); });
  }
  void stop() {
    if (!m_thread.joinable()) return;
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(m_stop, &one, sizeof one);
    m_thread.join();
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

TEST_F(LoopFixture, WaitsForTheKubeletThenRegistersOnce) {
  start();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(m_registrations, 0);
  kubelet_starts();
  ASSERT_TRUE(eventually([&] { return m_registrations == 1; }));
  EXPECT_TRUE(m_loop->registered());
  EXPECT_TRUE(std::filesystem::exists(m_plugin_dir / "plugin.sock"));
  stop();
  EXPECT_TRUE(m_result);
  EXPECT_FALSE(std::filesystem::exists(m_plugin_dir / "plugin.sock")) << "stop stops serving";
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
