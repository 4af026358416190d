// `gpufence install --watch`'s loop (install/watch.hpp) on a fake clock and a fake containerd: it
// re-checks every interval of the InstallEnv's clock (not the machine's), waits out a containerd
// that is mid-restart for the ready timeout, and installs again only when containerd lost the
// handler. No host, no sockets, no real waiting.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "install/watch.hpp"
#include "support/test_support.hpp"

namespace gpufence {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Time moves only when the code under test sleeps.
struct FakeClock {
  Clock::time_point t = Clock::time_point{} + 1000h;
};

// containerd's CRI as the loop sees it: each ask is recorded at the fake time it was made; the
// handler is loaded, missing, or containerd does not answer, per ask.
class FakeCri final : public RuntimeProbe, public ProcessRunner {
 public:
  explicit FakeCri(const FakeClock& clock) : m_clock(clock) {}
  enum class Answer { loaded, missing, down };
  std::function<Answer(size_t ask)> script = [](size_t) { return Answer::loaded; };
  std::vector<Clock::time_point> asks;

  Result<std::vector<LoadedRuntime>> loaded_runtimes(const std::string& socket,
                                                     std::chrono::milliseconds) override {
    asks.push_back(m_clock.t);
    switch (script(asks.size())) {
      case Answer::loaded:
        return std::vector<LoadedRuntime>{{"nvidia",
                                           "io.containerd.runc.v2",
                                           std::string("/usr/local/bin/gpufence-runtime"),
                                           "",
                                           {}}};
      case Answer::missing:
        return std::vector<LoadedRuntime>{{"runc", "io.containerd.runc.v2", std::nullopt, "", {}}};
      case Answer::down:
        break;
    }
    return fail(Errc::rpc, "connect ", socket, ": refused");
  }
  bool nri_listening(const std::string&) override { return false; }
  Result<ProcessResult> run(const std::vector<std::string>&) override {
    return fail(Errc::unsupported, "no host commands in this test");
  }

 private:
  const FakeClock& m_clock;
};

class InstallWatch : public ::testing::Test {
 protected:
  InstallWatch()
      : m_host(m_root.path().string()),
        m_cri(m_clock),
        m_env{m_host,
              m_cri,
              m_cri,
              nullptr,
              [this](std::chrono::milliseconds d) {
                m_clock.t += d;
                ++m_sleeps;
              },
              [this] { return m_clock.t; }} {
    m_opt.binary.link = "/usr/local/bin/gpufence-runtime";
    m_opt.ready_timeout = 60s;
    m_first.socket = "/run/containerd/containerd.sock";
    m_first.enforcement = Enforcement::runtime;
  }

  // Runs the loop until `done` (or, as a bound on a loop that ignores the fake clock, 3 s of
  // real time, which this loop never comes near).
  void run(std::chrono::milliseconds interval, std::function<bool()> done) {
    auto bound = Clock::now() + 3s;
    WatchHooks hooks{[&] { return done() || Clock::now() > bound; },
                     [this](const InstallReport& r) { m_reinstalls.push_back(r); },
                     [this](std::string_view line) { m_said.emplace_back(line); }};
    watch_install_loop(m_opt, m_env, m_first, interval, m_healthy, hooks);
  }

  test::TempDir m_root;  // an empty host: an install run here fails, harmlessly
  HostFs m_host;
  FakeClock m_clock;
  FakeCri m_cri;
  InstallEnv m_env;
  InstallOptions m_opt;
  InstallReport m_first;
  std::atomic<bool> m_healthy = false;
  std::vector<InstallReport> m_reinstalls;
  std::vector<std::string> m_said;
  size_t m_sleeps = 0;
};

// The loop was handed a clock in InstallEnv but read the machine's: an interval of 30 s then took
// 30 real seconds, and no test could drive it.
TEST_F(InstallWatch, ChecksEveryIntervalOfTheEnvClock) {
  const auto start = m_clock.t;
  run(30s, [&] { return m_cri.asks.size() >= 3; });
  ASSERT_EQ(m_cri.asks.size(), 3u) << "the loop never asked containerd: it waits on another clock";
  for (size_t i = 0; i < m_cri.asks.size(); ++i)
    EXPECT_EQ(m_cri.asks[i] - start, static_cast<long>(i + 1) * 30s) << "ask " << i;
  EXPECT_TRUE(m_healthy) << "a containerd running the handler makes /healthz 200";
  EXPECT_TRUE(m_reinstalls.empty());
}

TEST_F(InstallWatch, AContainerdBackWithinTheReadyTimeoutIsNotInstalledAgain) {
  // Down for 10 asks (2.25 s of retries), then back with the handler.
  m_cri.script = [](size_t ask) {
    return ask <= 10 ? FakeCri::Answer::down : FakeCri::Answer::loaded;
  };
  run(30s, [&] { return m_cri.asks.size() >= 11; });
  ASSERT_EQ(m_cri.asks.size(), 11u);
  EXPECT_EQ(m_cri.asks.back() - m_cri.asks.front(), 10 * 250ms) << "retried every 250 ms";
  EXPECT_TRUE(m_reinstalls.empty()) << "restarted a containerd that was coming back";
  EXPECT_TRUE(m_healthy);
}

TEST_F(InstallWatch, AContainerdDownPastTheReadyTimeoutIsInstalledAgain) {
  m_healthy = true;
  m_cri.script = [](size_t) { return FakeCri::Answer::down; };
  run(30s, [&] { return !m_reinstalls.empty(); });
  ASSERT_EQ(m_reinstalls.size(), 1u);
  EXPECT_GE(m_cri.asks.back() - m_cri.asks.front(), 60s) << "gave up before the ready timeout";
  EXPECT_LT(m_cri.asks.back() - m_cri.asks.front(), 60s + 250ms);
  ASSERT_FALSE(m_said.empty());
  EXPECT_NE(m_said.back().find("unverifiable: connect"), std::string::npos) << m_said.back();
  EXPECT_FALSE(m_healthy) << "the install on an empty host failed: /healthz must say 503";
}

TEST_F(InstallWatch, AHandlerMissingFromTheRunningContainerdIsInstalledAgainAtOnce) {
  m_healthy = true;
  m_cri.script = [](size_t) { return FakeCri::Answer::missing; };
  run(30s, [&] { return !m_reinstalls.empty(); });
  ASSERT_EQ(m_reinstalls.size(), 1u);
  EXPECT_EQ(m_cri.asks.size(), 1u) << "a containerd that answered needs no patience";
  EXPECT_NE(m_said.back().find("missing from the running containerd"), std::string::npos);
  EXPECT_FALSE(m_healthy);
}

// SIGTERM is seen within a slice of the wait, not after the whole interval.
TEST_F(InstallWatch, AStopRequestEndsTheWaitWithinASlice) {
  const auto start = m_clock.t;
  run(1h, [&] { return m_clock.t - start >= 1s; });
  EXPECT_TRUE(m_cri.asks.empty());
  EXPECT_LE(m_clock.t - start, 1s + 200ms);
}

}  // namespace
}  // namespace gpufence
