// NVML calls with a deadline. A driver in trouble can leave an NVML call blocked for minutes or
// forever (docs/deviceplugin.md, "A hung NVML"); the plugin must keep answering the kubelet and
// must stop on SIGTERM all the same. So every NVML call runs on one worker thread owned by the
// watchdog, and the caller waits for it with a deadline and a stop fd.
//
// One worker, not a pool: NVML serialises calls inside the library, so a second thread would
// only queue behind the hung call; and a hung thread can never be joined or cancelled
// (pthread_cancel into a vendor library is undefined), so each extra thread would be one more
// to leak. While a call is overdue the watchdog answers every new call at once with an error
// naming the hung call, and resumes when that call finally returns.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace gpufence {

class NvmlWatchdog {
 public:
  explicit NvmlWatchdog(std::chrono::milliseconds deadline);
  // Joins the worker when it is idle. When a call is still in flight the worker is detached
  // (it cannot be joined, see above): it owns its share of the state and exits harmlessly if the
  // call ever returns. The caller must then not unload what the call uses: gpufence-device-plugin
  // _exits instead of destroying its NvmlInventory (src/cli/device_plugin_main.cpp).
  ~NvmlWatchdog();
  NvmlWatchdog(const NvmlWatchdog&) = delete;
  NvmlWatchdog& operator=(const NvmlWatchdog&) = delete;

  std::chrono::milliseconds deadline() const { return m_deadline; }

  // Runs `fn` on the worker and waits until it returns, `deadline` (default: the watchdog's) has
  // passed, or `stop_fd` (when >= 0) is readable. R is a Result<T> or Status. Missing the deadline
  // or a stop is an Errc::nvml error naming `what`.
  template <class R>
  R call(std::string_view what, std::function<R()> fn, int stop_fd = -1,
         std::optional<std::chrono::milliseconds> deadline = std::nullopt) {
    auto slot = std::make_shared<std::optional<R>>();
    Status st = run(
        what, [slot, fn = std::move(fn)] { *slot = fn(); }, stop_fd, deadline.value_or(m_deadline));
    if (!st) return std::unexpected(st.error());
    if (!slot->has_value()) return fail(Errc::internal, what, " threw an exception");
    return std::move(**slot);
  }

  // The call that is in flight past its deadline ("nvmlDeviceGetUUID GPU-..."), if any.
  std::optional<std::string> overdue_call() const;
  // Waits up to `grace` for the worker to be idle; false when a call is still in flight.
  bool wait_idle(std::chrono::milliseconds grace) const;

  struct Shared;

 private:
  Status run(std::string_view what, std::function<void()> job, int stop_fd,
             std::chrono::milliseconds deadline);

  std::chrono::milliseconds m_deadline;
  std::shared_ptr<Shared> m_shared;
};

}  // namespace gpufence
