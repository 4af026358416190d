// The device plugin in this process (a fake GPU inventory) against the test kubelet in its
// upstream mode: clients live as in the real kubelet's device manager, where the end of any
// client's ListAndWatch stream disconnects the client current for the resource name and marks
// every device unhealthy (tools/test-kubelet/test_kubelet.hpp).
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <thread>

#include "deviceplugin/plugin.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"
#include "test_kubelet.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

class PluginAgainstKubelet : public ::testing::Test {
 protected:
  void SetUp() override {
    m_plugin_dir = m_dir / "device-plugins";
    std::filesystem::create_directories(m_plugin_dir);
    m_inventory.list = test::fake_gpus(2);
    m_stop = ::eventfd(0, EFD_CLOEXEC);
    m_kubelet = std::make_unique<test::TestKubelet>(m_plugin_dir);
  }
  void TearDown() override {
    if (m_thread.joinable()) {
      std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(m_stop, &one, sizeof one);
      m_thread.join();
    }
    m_plugin.reset();
    m_kubelet.reset();
    ::close(m_stop);
  }
  void start_plugin() {
    PluginOptions o;
    o.plugin_dir = m_plugin_dir.string();
    o.cdi_spec_dir = "";
    o.host_root = m_dir.path().string();
    o.health.enabled = false;
    // The default: with the old plugin, a kubelet that dropped it was noticed only after this.
    o.reregister_after = 30s;
    auto plugin = DevicePlugin::create({o, m_log, m_inventory, m_watchdog, m_metrics});
    ASSERT_TRUE(plugin) << plugin.error().message;
    m_plugin = std::move(*plugin);
    m_thread = std::thread([this] { m_result = m_plugin->run(m_stop); });
  }
  // What the kubelet counts as allocatable: every one of the plugin's devices Healthy, with a
  // client connected.
  bool allocatable(size_t n, std::chrono::milliseconds timeout) {
    return m_kubelet->wait_allocatable(n, timeout);
  }
  // Allocatable, and still so with no further disconnect `hold` later, within `timeout`.
  bool settles_allocatable(size_t n, std::chrono::milliseconds hold,
                           std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!allocatable(n, left)) return false;
      int disconnects = m_kubelet->disconnects();
      if (!m_kubelet->wait_disconnects(disconnects + 1, hold)) return true;
    }
    return false;
  }

  test::TempDir m_dir;
  std::filesystem::path m_plugin_dir;
  test::FakeInventory m_inventory;
  Logger m_log{LogLevel::off};
  NvmlWatchdog m_watchdog{10s};
  PluginMetrics m_metrics;
  int m_stop = -1;
  std::unique_ptr<test::TestKubelet> m_kubelet;
  std::unique_ptr<DevicePlugin> m_plugin;
  std::thread m_thread;
  Status m_result;
};

}  // namespace

// Each kubelet restart gets one Register, and the GPUs are allocatable after each.
TEST_F(PluginAgainstKubelet, OneRegistrationPerKubeletRestart) {
  m_kubelet->emulate_upstream_run_client();
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(allocatable(2, 10s));
  for (int i = 1; i <= 5; ++i) {
    m_kubelet->stop();
    m_kubelet->start();
    ASSERT_TRUE(m_kubelet->wait_registrations(i + 1, 5s)) << "restart " << i;
    ASSERT_TRUE(allocatable(2, 5s)) << "restart " << i;
    EXPECT_EQ(m_kubelet->registrations(), i + 1) << "restart " << i;
  }
}

// After a kubelet restart, a second Register for the same resource (the old plugin sent one when
// it read the new kubelet's socket creation after registering with it) replaces the kubelet's
// client without ending the first; the first one's stream then ends and the kubelet disconnects
// the *second*: every GPU unhealthy, no stream left. The plugin sees its current registration's
// stream ended by the kubelet whose socket is still the same, and registers again: allocatable
// within a second or so (it was 31 s: the no-stream re-registration after 30 s).
TEST_F(PluginAgainstKubelet, GpusAreAllocatableAgainSoonAfterADuplicateRegistrationIsDisconnected) {
  m_kubelet->emulate_upstream_run_client();
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(allocatable(2, 10s));
  m_kubelet->stop();
  m_kubelet->start();
  ASSERT_TRUE(m_kubelet->wait_registrations(2, 5s));
  ASSERT_TRUE(allocatable(2, 5s));

  ASSERT_TRUE(m_kubelet->register_plugin(m_kubelet->last_registration()).ok());  // the third
  int disconnects = m_kubelet->disconnects();  // Stop's, of the first kubelet
  ASSERT_TRUE(m_kubelet->end_stream_of(2));     // the replaced client's stream ends
  ASSERT_TRUE(m_kubelet->wait_disconnects(disconnects + 1, 5s))
      << "runClient disconnected the current client";
  EXPECT_TRUE(settles_allocatable(2, 500ms, 5s)) << "the plugin registers again by itself";
  EXPECT_EQ(m_kubelet->registrations(), 4);
}

// A kubelet slow to handle a stream's end (its goroutine scheduled late on a busy node): the end
// of the disconnected client's own stream is handled after the plugin already registered again,
// and takes that registration down too. The growing wait between registrations outlasts the
// kubelet's delay, and the GPUs end up allocatable.
TEST_F(PluginAgainstKubelet, ASlowKubeletsDisconnectsInARowStillEndAllocatable) {
  m_kubelet->emulate_upstream_run_client(400ms);
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(allocatable(2, 10s));
  ASSERT_TRUE(m_kubelet->register_plugin(m_kubelet->last_registration()).ok());
  ASSERT_TRUE(m_kubelet->end_stream_of(1));
  ASSERT_TRUE(m_kubelet->wait_disconnects(1, 5s));
  // Settled: allocatable, and no disconnect in well over the kubelet's reaction time after.
  EXPECT_TRUE(settles_allocatable(2, 1500ms, 15s))
      << m_kubelet->disconnects() << " disconnects, " << m_kubelet->registrations()
      << " registrations";
  EXPECT_GE(m_kubelet->disconnects(), 2) << "the slow kubelet took a new registration down too";
}
