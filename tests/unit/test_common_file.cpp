#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include "common/file.hpp"
#include "common/process.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

TEST(File, AtomicWriteReplacesContentAndKeepsMode) {
  test::TempDir dir;
  auto path = dir.write("config.json", "old");
  ::chmod(path.c_str(), 0600);
  ASSERT_TRUE(write_file_atomic(path, "new content"));
  EXPECT_EQ(read_file(path).value(), "new content");
  struct stat st {};
  ::stat(path.c_str(), &st);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // No temp file left beside it.
  size_t entries = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);
}

// A write to the very file that is then checked fails half way: RLIMIT_FSIZE stops the temp
// file's write(2) with EFBIG (root included, unlike permissions), after some bytes went out.
TEST(File, FailedWriteLeavesTheOldFile) {
  test::TempDir dir;
  auto path = dir.write("sub/config.json", "keep me");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto st = write_file_atomic(path, std::string(1 << 20, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(st) << "a 1 MiB write under a 4 KiB limit must fail";
  EXPECT_NE(st.error().message.find("config.json"), std::string::npos) << st.error().message;
  EXPECT_EQ(read_file(path).value(), "keep me");
  size_t entries = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir / "sub")) ++entries;
  EXPECT_EQ(entries, 1u) << "the temp file is removed";
}

TEST(File, FailedWriteIntoAMissingDirectoryNamesIt) {
  test::TempDir dir;
  auto st = write_file_atomic(dir / "nope/config.json", "x");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("nope"), std::string::npos);
}

TEST(File, BackupsAreExclusiveAndNeverFollowALink) {
  test::TempDir dir;
  auto path = dir.write("config.toml", "current");
  auto a = write_backup_exclusive(path, "one", "20261201T000000Z");
  auto b = write_backup_exclusive(path, "two", "20261201T000000Z");
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(read_file(*a).value(), "one") << "the first backup is not overwritten";
  EXPECT_EQ(read_file(*b).value(), "two");
  // A link planted at the next name is not followed: its target stays as it was.
  auto victim = dir.write("victim", "untouched");
  std::filesystem::create_symlink(victim, path.native() + ".bak-X");
  auto c = write_backup_exclusive(path, "three", "X");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->native(), path.native() + ".bak-X.1");
  EXPECT_EQ(read_file(victim).value(), "untouched");
}

TEST(File, WriteTargetFollowsLinksUnderTheRoot) {
  test::TempDir dir;
  dir.write("opt/real.toml", "x");
  std::filesystem::create_directories(dir / "etc");
  std::filesystem::create_symlink("/opt/real.toml", dir / "etc/abs.toml");
  std::filesystem::create_symlink("abs.toml", dir / "etc/rel.toml");
  EXPECT_EQ(write_target_through_links(dir / "etc/rel.toml", dir.path()).value(),
            dir / "opt/real.toml");
  EXPECT_EQ(write_target_through_links(dir / "opt/real.toml", dir.path()).value(),
            dir / "opt/real.toml");
  EXPECT_EQ(write_target_through_links(dir / "absent", dir.path()).value(), dir / "absent");
  std::filesystem::create_symlink("loop", dir / "loop");
  EXPECT_FALSE(write_target_through_links(dir / "loop", dir.path()));
}

TEST(File, ReadsProcFilesWhoseSizeIsZero) {
  auto status = read_file("/proc/self/status");
  ASSERT_TRUE(status);
  EXPECT_NE(status->find("CapBnd"), std::string::npos);
}

TEST(Process, FixedEnvironmentTimeoutAndNoLeakedDescriptors) {
  ProcessOptions only_path;
  only_path.env = std::vector<std::string>{"PATH=/usr/bin:/bin"};
  auto env = run_process({"/usr/bin/env"}, only_path);
  ASSERT_TRUE(env) << env.error().message;
  EXPECT_EQ(env->out, "PATH=/usr/bin:/bin\n") << "nothing of ours leaks into the child's env";
  ProcessOptions quick;
  quick.timeout = std::chrono::milliseconds(200);
  auto slow = run_process({"/bin/sleep", "5"}, quick);
  ASSERT_TRUE(slow);
  EXPECT_TRUE(slow->timed_out);
  EXPECT_EQ(slow->exit_code, 128 + SIGKILL);
  // Only 0, 1 and 2 (and the listing's own directory descriptor) are open in the child, even
  // with a descriptor of ours that is not close-on-exec.
  int stray = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(stray, 0);
  auto fds = run_process({"/bin/ls", "/proc/self/fd"});
  ::close(stray);
  ASSERT_TRUE(fds);
  EXPECT_EQ(fds->out, "0\n1\n2\n3\n") << fds->out;
}
