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

// ---- temp files: one rule for every writer and for whoever cleans up after a killed one ----

TEST(TempName, OneShapeBesideTheTargetNamedAfterIt) {
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(temp_name_for("config.toml", 0), ".config.toml.gpufence-" + pid + "-0");
  EXPECT_EQ(temp_name_for("config.toml", 7), ".config.toml.gpufence-" + pid + "-7");
  for (unsigned attempt : {0u, 1u, 99u}) {
    EXPECT_TRUE(is_temp_name_for(temp_name_for("config.toml", attempt), "config.toml"));
    EXPECT_EQ(temp_target_name(temp_name_for("config.toml", attempt)), "config.toml");
  }
}

// A cleanup removes what it recognises: a name that merely resembles a temp file is a user's.
TEST(TempName, ANameThatMerelyContainsTmpIsNotOne) {
  for (const char* decoy : {"config.toml.tmp",
                            ".config.toml.tmp",
                            ".config.toml.tmpl",
                            ".config.toml.tmp-",
                            ".config.toml.tmp-backup",
                            ".config.toml.tmp-12.old",
                            ".config.toml.tmp-12-3",
                            "config.toml.tmp-12",
                            ".config.toml.gpufence-",
                            ".config.toml.gpufence-12-",
                            ".config.toml.gpufence--3",
                            ".config.toml.gpufence-x-1",
                            ".config.toml.gpufence-1-2-3",
                            ".config.toml.gpufence-notes",
                            "config.toml.gpufence-12-0",
                            ".config.toml",
                            "config.toml",
                            ".gpufence-notes",
                            ".tmp-12",
                            "..gpufence-1-0",
                            "...tmp-1",
                            ""}) {
    EXPECT_FALSE(is_temp_name_for(decoy, "config.toml")) << decoy;
    EXPECT_FALSE(temp_target_name(decoy)) << decoy;
  }
}

TEST(TempName, AnotherTargetsTempIsNotOurs) {
  const std::string other = temp_name_for("config.toml.d", 0);
  EXPECT_FALSE(is_temp_name_for(other, "config.toml"));
  EXPECT_FALSE(is_temp_name_for(temp_name_for("config.toml", 0), "config"));
  EXPECT_FALSE(is_temp_name_for(temp_name_for("config.toml", 0), "onfig.toml"));
  EXPECT_FALSE(is_temp_name_for(temp_name_for("config.toml", 0), ""));
  // A target whose own name looks like a temp file: its temp belongs to it, not to "a".
  const std::string odd = temp_name_for("a.gpufence-1-2", 0);
  EXPECT_TRUE(is_temp_name_for(odd, "a.gpufence-1-2"));
  EXPECT_FALSE(is_temp_name_for(odd, "a"));
  EXPECT_TRUE(is_temp_name_for(temp_name_for("b.tmp-4", 3), "b.tmp-4"));
  EXPECT_FALSE(is_temp_name_for(temp_name_for("b.tmp-4", 3), "b"));
}

// Shapes that releases before the one rule left on nodes (install's link swap, the
// update-ldcache hook): still recognised, so an upgrade cleans up after an old killed run.
TEST(TempName, LeftoversOfEarlierWritersAreRecognised) {
  EXPECT_TRUE(is_temp_name_for(".gpufence-runtime.tmp-4242", "gpufence-runtime"));
  EXPECT_TRUE(is_temp_name_for(".gpufence-nri.tmp-1", "gpufence-nri"));
  EXPECT_TRUE(is_temp_name_for(".00-gpufence-cdi.conf.gpufence-77", "00-gpufence-cdi.conf"));
  EXPECT_TRUE(is_temp_name_for(".config.toml.gpufence-12-0", "config.toml"));
  EXPECT_TRUE(is_temp_name_for(".gpufence-runtime-0123456789abcdef.gpufence-9-1",
                               "gpufence-runtime-0123456789abcdef"));
  EXPECT_FALSE(is_temp_name_for(".gpufence-runtime.tmp-4242", "gpufence-nri"));
}

// write_file_atomic takes its temp name from the rule, and never opens nor follows what is
// planted at a taken one: a dangling link at attempt 0 stays dangling.
TEST(TempName, AtomicWriteUsesTheRuleAndSkipsAPlantedName) {
  test::TempDir dir;
  std::filesystem::create_symlink(dir / "victim", dir / temp_name_for("config.json", 0));
  // A directory at the name makes the rename fail, which names the temp file it used.
  dir.write("config.json/inside", "x");
  auto st = write_file_atomic(dir / "config.json", "new");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find(temp_name_for("config.json", 1)), std::string::npos)
      << st.error().message;
  EXPECT_FALSE(std::filesystem::exists(dir / "victim")) << "the planted link was followed";
  EXPECT_TRUE(std::filesystem::is_symlink(dir / temp_name_for("config.json", 0)));
  EXPECT_FALSE(std::filesystem::exists(dir / temp_name_for("config.json", 1)))
      << "the failed write left its temp file";
  std::filesystem::remove_all(dir / "config.json");
  ASSERT_TRUE(write_file_atomic(dir / "config.json", "new"));
  EXPECT_EQ(read_file(dir / "config.json").value(), "new");
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
