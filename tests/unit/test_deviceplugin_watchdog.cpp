// NvmlWatchdog: NVML calls with a deadline, a stop fd, and a worker that a hung call cannot take
// down with it.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>

#include "deviceplugin/watchdog.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

// A call that blocks until released, like an NVML call stuck in the driver. Shared by the job so
// a job the watchdog abandoned can still finish after the test body moved on.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  bool entered = false;

  void release() {
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
  void wait_entered() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  Result<int> pass(int value) {
    std::unique_lock lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
    return value;
  }
};

}  // namespace

TEST(Watchdog, ReturnsWhatTheCallReturns) {
  NvmlWatchdog w(1s);
  EXPECT_EQ(w.call<Result<int>>("answer", [] { return Result<int>(42); }).value(), 42);
  auto err = w.call<Status>("refusal", [] { return Status(fail(Errc::nvml, "GPU is lost")); });
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error().message, "GPU is lost");
  EXPECT_FALSE(w.overdue_call());
}

TEST(Watchdog, AMissedDeadlineNamesTheCallAndLaterCallsFailAtOnceUntilItReturns) {
  auto gate = std::make_shared<Gate>();
  NvmlWatchdog w(50ms);
  auto hung = w.call<Result<int>>("nvmlDeviceGetUUID GPU-a", [gate] { return gate->pass(1); });
  ASSERT_FALSE(hung);
  EXPECT_EQ(hung.error().message,
            "nvmlDeviceGetUUID GPU-a did not return within 50 ms (NVML hung?)");
  ASSERT_TRUE(w.overdue_call());
  EXPECT_TRUE(w.overdue_call()->starts_with("nvmlDeviceGetUUID GPU-a"));

  bool ran = false;
  auto next = w.call<Status>("nvmlDeviceGetUUID GPU-b", [&] {
    ran = true;
    return Status{};
  });
  ASSERT_FALSE(next);
  EXPECT_FALSE(ran) << "queued behind a hung call, it would hang too";
  EXPECT_TRUE(next.error().message.starts_with(
      "nvmlDeviceGetUUID GPU-b: not attempted, NVML has not returned from nvmlDeviceGetUUID GPU-a"))
      << next.error().message;

  gate->release();
  ASSERT_TRUE(w.wait_idle(5s));
  EXPECT_FALSE(w.overdue_call());
  EXPECT_EQ(w.call<Result<int>>("again", [] { return Result<int>(7); }).value(), 7);
}

TEST(Watchdog, AStopFdEndsTheWaitAtOnce) {
  auto gate = std::make_shared<Gate>();
  NvmlWatchdog w(1h);
  int stop = ::eventfd(0, EFD_CLOEXEC);
  std::uint64_t one = 1;
  ASSERT_EQ(::write(stop, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  auto r = w.call<Result<int>>(
      "nvmlEventSetWait_v2", [gate] { return gate->pass(1); }, stop);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "nvmlEventSetWait_v2: stopped while waiting");
  EXPECT_FALSE(w.overdue_call()) << "stopped, not overdue";
  gate->release();
  EXPECT_TRUE(w.wait_idle(5s));
  ::close(stop);
}

TEST(Watchdog, DestroyingItDoesNotWaitForAHungCall) {
  auto gate = std::make_shared<Gate>();
  {
    NvmlWatchdog w(20ms);
    EXPECT_FALSE(w.call<Result<int>>("hung", [gate] { return gate->pass(1); }));
    gate->wait_entered();
  }                 // would block here forever if the destructor joined the worker
  gate->release();  // the detached worker finishes into state it shares, then exits
}
