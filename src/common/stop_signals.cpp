#include "common/stop_signals.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>

#include <algorithm>
#include <climits>
#include <utility>

namespace gpufence {

namespace {

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

Result<StopSignals> StopSignals::block() {
  const sigset_t set = stop_set();
  if (int rc = ::pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0)
    return fail_errno("block", "SIGTERM and SIGINT", rc);
  Fd fd{::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)};
  if (fd.fd < 0) return fail_errno("signalfd for", "SIGTERM and SIGINT");
  return StopSignals(std::move(fd));
}

bool StopSignals::stop_requested() const {
  return wait_for(std::chrono::milliseconds(0));
}

bool StopSignals::wait_for(std::chrono::milliseconds timeout) const {
  // poll's timeout is an int of milliseconds: a longer wait is cut into pieces that fit.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int slice =
        static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(left.count(), 0, INT_MAX));
    pollfd p{m_fd.fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, slice);
    if (ready > 0) return true;
    // EINTR is some other signal's handler; anything else cannot wait: say no stop came.
    if (ready < 0 && errno != EINTR) return false;
    if (ready == 0 && left.count() <= INT_MAX) return false;  // waited the whole time
  }
}

}  // namespace gpufence
