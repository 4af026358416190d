// run_process and spawn_process (common/process.hpp), the one way the project starts a helper
// program: what the child inherits from us is exactly what the promises say, nothing more.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "common/process.hpp"
#include "common/strings.hpp"

using namespace gpufence;

TEST(Process, TheChildGetsExactlyTheEnvironmentGiven) {
  auto r = run_process({"/usr/bin/env"}, {.env = std::vector<std::string>{"ONLY=this"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->out, "ONLY=this\n");
}

TEST(Process, NoDescriptorOfOursReachesTheChild) {
  int fd = ::open("/dev/null", O_RDONLY);  // deliberately without O_CLOEXEC
  ASSERT_GE(fd, 3);
  auto r = run_process(
      {"/bin/sh", "-c", cat("test -e /proc/self/fd/", fd, " && echo leaked || echo closed")});
  ::close(fd);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->out, "closed\n");
}

// StopSignals blocks SIGTERM and SIGINT for its signalfd; a child that inherited that mask
// could not be stopped by either. Failed before spawn_process reset the mask.
TEST(Process, TheChildStartsWithNoSignalBlocked) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  ASSERT_EQ(::sigprocmask(SIG_BLOCK, &block, &old), 0);
  // grep itself, not through sh: dash clears its signal mask when it starts.
  auto r = run_process({"/bin/grep", "^SigBlk:", "/proc/self/status"});
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->out, "SigBlk:\t0000000000000000\n");
}

TEST(Process, APastItsTimeLimitChildIsKilled) {
  auto start = std::chrono::steady_clock::now();
  ProcessOptions options;
  options.timeout = std::chrono::milliseconds(200);
  auto r = run_process({"/bin/sleep", "30"}, options);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->exit_code, 128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Process, StandardDescriptorsAreTheCallersOrDevNull) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  SpawnOptions options;
  options.stdout_fd = options.stderr_fd = pipe_fds[1];
  auto pid = spawn_process({"/bin/sh", "-c", "cat; echo out; echo err >&2"}, options);
  ::close(pipe_fds[1]);
  ASSERT_TRUE(pid) << pid.error().message;
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  EXPECT_EQ(wait_for_exit(*pid, std::chrono::seconds(10)).exit_code, 0);
  EXPECT_EQ(out, "out\nerr\n") << "stdin is /dev/null: cat read nothing";
  EXPECT_FALSE(spawn_process({}));
  EXPECT_FALSE(spawn_process({"/no/such/program"}));
}

// The one way every binary finds itself and what ships beside it.
TEST(Process, ABinaryFindsItselfAndItsSiblings) {
  std::error_code ec;
  auto canonical = std::filesystem::canonical("/proc/self/exe", ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(self_executable(), canonical.string());
  EXPECT_EQ(beside_self("gpufence-runtime"),
            (canonical.parent_path() / "gpufence-runtime").string());
}
