// HealthMonitor over a fake GpuInventory whose liveness call can hang: a hung call makes GPUs
// Unhealthy, never blocks readers, and never blocks stop().
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "deviceplugin/health_monitor.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

class HangingInventory final : public GpuInventory {
 public:
  Result<std::vector<Gpu>> gpus() override { return std::vector<Gpu>{}; }
  Result<std::vector<GpuProcess>> processes(const std::string&) override {
    return std::vector<GpuProcess>{};
  }
  Result<Topology> topology(const std::string&, const std::string&) override { return Topology{}; }
  Status check_alive(const std::string&) override {
    std::unique_lock lock(mu);
    ++in_call;
    cv.notify_all();
    cv.wait(lock, [&] { return !hang; });
    --in_call;
    return {};
  }
  Result<std::optional<GpuEvent>> wait_event(std::chrono::milliseconds) override {
    ++waits;
    // The driver answers every wait at once with GPU_IS_LOST while a GPU is lost.
    if (lost) return std::optional<GpuEvent>{GpuEvent{"", 79, true}};
    if (events) return std::optional<GpuEvent>{};
    return fail(Errc::nvml, "NVML library has no event API (nvmlEventSetWait_v2)");
  }
  std::vector<EventRegistrationFailure> event_registration_failures() override {
    return {{"GPU-b", "nvmlDeviceRegisterEvents GPU-b: Not Supported (NVML error 3)"}};
  }

  void set_hang(bool h) {
    std::lock_guard lock(mu);
    hang = h;
    cv.notify_all();
  }
  void wait_in_call() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return in_call > 0; });
  }

  bool events = false;
  std::atomic<bool> lost{false};
  std::atomic<int> waits{0};

 private:
  std::mutex mu;
  std::condition_variable cv;
  bool hang = false;
  int in_call = 0;
};

std::vector<MonitoredGpu> two_gpus() {
  return {{"GPU-a", "GPU-a"}, {"GPU-b", "GPU-b"}};
}

}  // namespace

TEST(HealthMonitor, AHungLivenessCallMakesTheGpusUnhealthyAndTheyRecoverWhenItReturns) {
  HangingInventory inv;  // outlives the watchdog: an abandoned call may still be running in it
  // 1 s, not less: the calls that must answer in time run on a loaded 2-core CI machine too.
  NvmlWatchdog nvml(1s);
  Logger log(LogLevel::off);
  int changes = 0;
  HealthMonitor m(inv, nvml, two_gpus(), HealthOptions{}, log, [&] { ++changes; });
  EXPECT_FALSE(m.step()) << "all answer: nothing changes";
  inv.set_hang(true);
  EXPECT_TRUE(m.step());
  EXPECT_FALSE(m.healthy("GPU-a"));
  EXPECT_NE(m.reason("GPU-a").find("nvmlDeviceGetUUID GPU-a did not return within 1000 ms"),
            std::string::npos)
      << m.reason("GPU-a");
  EXPECT_FALSE(m.healthy("GPU-b")) << "its call cannot be made while NVML is stuck";
  EXPECT_NE(m.reason("GPU-b").find("not attempted"), std::string::npos) << m.reason("GPU-b");
  EXPECT_EQ(changes, 1);
  inv.set_hang(false);
  ASSERT_TRUE(nvml.wait_idle(5s));
  EXPECT_TRUE(m.step());
  EXPECT_TRUE(m.healthy("GPU-a"));
  EXPECT_TRUE(m.healthy("GPU-b"));
}

TEST(HealthMonitor, StopAndReadersNeverWaitForAHungCall) {
  HangingInventory inv;
  NvmlWatchdog nvml(1h);  // the call never times out: only stop() can end the wait
  Logger log(LogLevel::off);
  HealthMonitor m(inv, nvml, two_gpus(), HealthOptions{}, log, nullptr);
  inv.set_hang(true);
  ASSERT_TRUE(m.start());
  inv.wait_in_call();
  EXPECT_TRUE(m.healthy("GPU-a")) << "a reader does not wait for NVML";
  m.stop();  // would block here forever if the monitor thread sat inside NVML
  inv.set_hang(false);
  EXPECT_TRUE(nvml.wait_idle(5s));
}

TEST(HealthMonitor, LogsEachGpuWhoseEventsCouldNotBeRegistered) {
  test::TempDir dir;
  HangingInventory inv;
  inv.events = true;
  NvmlWatchdog nvml(1s);
  Logger log(LogLevel::info);
  ASSERT_TRUE(log.open_file((dir / "log").string()));
  HealthMonitor m(inv, nvml, two_gpus(), HealthOptions{}, log, nullptr);
  m.step();
  m.step();
  std::ifstream in(dir / "log");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string line = "event=plugin.gpu_events_unregistered uuid=GPU-b";
  auto first = text.find(line);
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find(line, first + line.size()), std::string::npos) << "reported once";
}

// A lost GPU makes every event wait return at once: the monitor must not spin on it, nor log
// each one (a node's log filled at thousands of lines a second).
TEST(HealthMonitor, ALostGpusImmediateWaitsNeitherSpinNorFloodTheLog) {
  test::TempDir dir;
  HangingInventory inv;
  inv.events = true;
  inv.lost = true;
  NvmlWatchdog nvml(1s);
  Logger log(LogLevel::info);
  ASSERT_TRUE(log.open_file((dir / "log").string()));
  HealthMonitor m(inv, nvml, two_gpus(), HealthOptions{}, log, nullptr);
  ASSERT_TRUE(m.start());
  std::this_thread::sleep_for(1200ms);
  m.stop();
  EXPECT_LE(inv.waits.load(), 5) << "about one wait per 500 ms, not a busy loop";
  std::ifstream in(dir / "log");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  size_t n = 0;
  for (size_t at = text.find("event=plugin.gpu_event "); at != std::string::npos;
       at = text.find("event=plugin.gpu_event ", at + 1))
    ++n;
  EXPECT_EQ(n, 1u) << text;
}
