// StopSignals: SIGTERM and SIGINT blocked and read from a signalfd. Each case runs in a child
// process of its own, so the test binary's signal mask stays as it was; the child reports the
// first check that failed as its exit status.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <thread>

#include "common/process.hpp"
#include "common/stop_signals.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

// Runs `body` in a forked child; its return value becomes the exit status (0: every check held).
int in_child(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) ::_exit(body());
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) return 1000 + WTERMSIG(status);  // the signal was not held
  return WEXITSTATUS(status);
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

TEST(StopSignals, NothingIsRequestedUntilASignalComes) {
  EXPECT_EQ(in_child([] {
              auto stop = StopSignals::block();
              if (!stop) return 2;
              if (stop->stop_requested()) return 3;
              if (readable(stop->fd())) return 4;
              const auto start = std::chrono::steady_clock::now();
              if (stop->wait_for(50ms)) return 5;
              if (std::chrono::steady_clock::now() - start < 50ms) return 6;  // it did wait
              return 0;
            }),
            0);
}

// SIGTERM (the kubelet's and containerd's) and SIGINT (^C) both ask to stop; the request stays
// pending, so every later ask answers the same and the process is never killed by it.
TEST(StopSignals, SigtermAndSigintAreSeenAndStayPending) {
  for (int sig : {SIGTERM, SIGINT}) {
    EXPECT_EQ(in_child([sig] {
                auto stop = StopSignals::block();
                if (!stop) return 2;
                ::kill(::getpid(), sig);  // to the process, as kill(1) sends it
                if (!stop->stop_requested()) return 3;
                if (!stop->stop_requested()) return 4;
                if (!readable(stop->fd())) return 5;
                if (!stop->wait_for(0ms)) return 6;
                return 0;
              }),
              0)
        << strsignal(sig);
  }
}

// A thread started after block() inherits the mask: the signal reaches the descriptor, never a
// thread's default action (which would end the process at once).
TEST(StopSignals, ThreadsStartedAfterwardDoNotTakeTheSignal) {
  EXPECT_EQ(in_child([] {
              auto stop = StopSignals::block();
              if (!stop) return 2;
              std::thread busy([] { std::this_thread::sleep_for(300ms); });
              ::kill(::getpid(), SIGTERM);
              busy.join();
              return stop->stop_requested() ? 0 : 3;
            }),
            0);
}

// wait_for returns when the signal comes, not when its time is up.
TEST(StopSignals, WaitForWakesWhenTheSignalArrives) {
  EXPECT_EQ(in_child([] {
              auto stop = StopSignals::block();
              if (!stop) return 2;
              std::thread sender([] {
                std::this_thread::sleep_for(50ms);
                ::kill(::getpid(), SIGTERM);
              });
              const auto start = std::chrono::steady_clock::now();
              bool seen = stop->wait_for(std::chrono::hours(1));
              sender.join();
              if (!seen) return 3;
              if (std::chrono::steady_clock::now() - start > 30s) return 4;
              return 0;
            }),
            0);
}

// The blocked mask is ours alone: a child started meanwhile (containerd's restart, ldconfig) is
// stopped by SIGTERM as usual (spawn_process resets the mask).
TEST(StopSignals, AChildIsStillStoppedBySigterm) {
  EXPECT_EQ(in_child([] {
              auto stop = StopSignals::block();
              if (!stop) return 2;
              // sleep(1) keeps the mask it starts with (dash, unlike it, clears its own).
              auto pid = spawn_process({"/bin/sleep", "10"});
              if (!pid) return 3;
              ::kill(*pid, SIGTERM);
              ProcessResult r = wait_for_exit(*pid, 20s);
              if (r.exit_code != 128 + SIGTERM) return 4;  // blocked, it slept 10 s and exited 0
              return stop->stop_requested() ? 5 : 0;       // the child's signal was not ours
            }),
            0);
}
