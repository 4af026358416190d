// The keeper's locks (src/nri/keeper.hpp): who serves a role is whoever holds its lock, and a
// server that is stopped is seen as stopped.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "nri/keeper.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace gpufence::nri;
using gpufence::test::TempDir;

TEST(NriKeeper, TheServingLockNamesItsHolderAndIsFreedWithIt) {
  TempDir dir;
  KeeperFiles files{(dir.path() / "nri").string()};
  EXPECT_FALSE(lock_holder(files.serving(Role::decider)));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    auto lock = take_lock(files.serving(Role::decider), LockWait::no);
    char ok = lock && *lock ? 1 : 0;
    (void)!::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  auto holder = lock_holder(files.serving(Role::decider));
  ASSERT_TRUE(holder);
  EXPECT_EQ(holder->pid, child);
  // A second server of the role does not get it; the fence's is another lock.
  auto second = take_lock(files.serving(Role::decider), LockWait::no);
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_FALSE(*second);
  EXPECT_FALSE(lock_holder(files.serving(Role::fence)));
  // Stopped: seen as stopped (the keeper kills it after kStoppedGrace).
  EXPECT_FALSE(process_stopped(*holder));
  ::kill(child, SIGSTOP);
  for (int i = 0; i < 200 && !process_stopped(*holder); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(process_stopped(*holder));
  // The same pid with another start time is another process (a reused pid): never "stopped",
  // so never killed.
  LockHolder reused = *holder;
  ++reused.start_time;
  EXPECT_FALSE(process_stopped(reused));
  EXPECT_EQ(holder_executable(reused), "");
  EXPECT_NE(holder_executable(*holder), "");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(lock_holder(files.serving(Role::decider)));
  auto third = take_lock(files.serving(Role::decider), LockWait::no);
  ASSERT_TRUE(third && *third);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(NriKeeper, ALinkPlantedAtTheLockIsNeverFollowed) {
  TempDir dir;
  KeeperFiles files{(dir.path() / "nri").string()};
  ASSERT_EQ(::mkdir(files.dir.c_str(), 0700), 0);
  std::string victim = (dir.path() / "victim").string();
  ASSERT_EQ(::symlink(victim.c_str(), files.serving(Role::decider).c_str()), 0);
  auto lock = take_lock(files.serving(Role::decider), LockWait::no);
  EXPECT_FALSE(lock);
  EXPECT_NE(::access(victim.c_str(), F_OK), 0);  // nothing created through the link
}
