#include "deviceplugin/watchdog.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace gpufence {

namespace {

using Clock = std::chrono::steady_clock;

// One call handed to the worker. Shared by the caller and the worker, so a caller that gives up
// leaves the worker something valid to finish into.
struct Call {
  std::string what;
  std::function<void()> job;
  int done_fd = -1;  // an eventfd the worker signals, so the caller can poll it with its stop fd
  bool done = false;
  bool overdue = false;
  Clock::time_point started = Clock::now();

  Call(std::string w, std::function<void()> j, int fd)
      : what(std::move(w)), job(std::move(j)), done_fd(fd) {}
  ~Call() { ::close(done_fd); }
};

long long ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

}  // namespace

struct NvmlWatchdog::Shared {
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::shared_ptr<Call> queued;     // handed over, not yet picked up
  std::shared_ptr<Call> in_flight;  // from hand-over until it returns
  bool quit = false;
  std::thread worker;
};

namespace {

void work(std::shared_ptr<NvmlWatchdog::Shared> s) {
  std::unique_lock lock(s->mu);
  while (true) {
    s->cv.wait(lock, [&] { return s->quit || s->queued; });
    if (!s->queued) return;
    auto call = std::move(s->queued);
    lock.unlock();
    try {
      call->job();
    } catch (...) {
      // The caller sees an empty result and reports it; the worker must survive.
    }
    call->job = nullptr;  // drop what the job captured before anyone waits on us
    lock.lock();
    call->done = true;
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(call->done_fd, &one, sizeof one);
    s->in_flight.reset();
    s->cv.notify_all();
  }
}

}  // namespace

NvmlWatchdog::NvmlWatchdog(std::chrono::milliseconds deadline)
    : m_deadline(deadline), m_shared(std::make_shared<Shared>()) {
  m_shared->worker = std::thread(work, m_shared);
}

NvmlWatchdog::~NvmlWatchdog() {
  bool busy;
  {
    std::lock_guard lock(m_shared->mu);
    m_shared->quit = true;
    busy = m_shared->in_flight != nullptr;
    m_shared->cv.notify_all();
  }
  if (busy)
    m_shared->worker.detach();  // stuck in NVML: it cannot be joined (see the header)
  else
    m_shared->worker.join();
}

Status NvmlWatchdog::run(std::string_view what, std::function<void()> job, int stop_fd,
                         std::chrono::milliseconds deadline) {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return fail_errno("eventfd for", what);
  auto call = std::make_shared<Call>(std::string(what), std::move(job), fd);
  {
    std::lock_guard lock(m_shared->mu);
    if (const auto& busy = m_shared->in_flight) {
      return fail(Errc::nvml, what, ": not attempted, NVML has not returned from ", busy->what,
                  " for ", ms_since(busy->started), " ms");
    }
    m_shared->in_flight = call;
    m_shared->queued = call;
    m_shared->cv.notify_all();
  }
  const auto until = Clock::now() + deadline;
  while (true) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int ready =
        left.count() > 0 ? ::poll(fds, stop_fd >= 0 ? 2 : 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    std::lock_guard lock(m_shared->mu);
    if (call->done) return {};
    if (ready < 0) return fail_errno("poll for", what);
    if (stop_fd >= 0 && fds[1].revents) return fail(Errc::nvml, what, ": stopped while waiting");
    if (ready == 0 && Clock::now() >= until) {
      call->overdue = true;
      return fail(Errc::nvml, what, " did not return within ", deadline.count(),
                  " ms (NVML hung?)");
    }
  }
}

std::optional<std::string> NvmlWatchdog::overdue_call() const {
  std::lock_guard lock(m_shared->mu);
  const auto& c = m_shared->in_flight;
  if (c && c->overdue) return cat(c->what, " (for ", ms_since(c->started), " ms)");
  return std::nullopt;
}

bool NvmlWatchdog::wait_idle(std::chrono::milliseconds grace) const {
  std::unique_lock lock(m_shared->mu);
  return m_shared->cv.wait_for(lock, grace, [&] { return m_shared->in_flight == nullptr; });
}

}  // namespace gpufence
