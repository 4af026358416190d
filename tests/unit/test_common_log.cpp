// The product's one escaping (common/escape.hpp) and the Logger's file: what a pod controls is data
// in every line, and no planted link, FIFO or hard link decides where root appends.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>

#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/log.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

TEST(Escape, ControlsQuotesAndInvalidUtf8AreEscapedUtf8Passes) {
  EXPECT_EQ(escape_text("plain GPU-1"), "plain GPU-1");
  EXPECT_EQ(escape_text("a\nb\rc\x1b[31m\x7f"), "a\\x0ab\\x0dc\\x1b[31m\\x7f");
  EXPECT_EQ(escape_text("\\x41"), "\\\\x41");
  EXPECT_EQ(escape_text("\xc3\xa9\xe6\x97\xa5"), "\xc3\xa9\xe6\x97\xa5");
  EXPECT_EQ(escape_text("\xc2\x85"), "\\xc2\\x85");           // U+0085, a C1 control (NEL)
  EXPECT_EQ(escape_text("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(escape_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(escape_text("\xe6\x97"), "\\xe6\\x97");           // truncated
  EXPECT_EQ(escape_text("$x", "$"), "\\x24x");
}

TEST(Escape, LogValueKeepsPodBytesOutOfShellAndLineSyntax) {
  EXPECT_EQ(log_value("GPU-1,GPU-2"), "GPU-1,GPU-2");
  EXPECT_EQ(log_value(""), "\"\"");
  std::string v = log_value(" /var/log/pwn.so $(touch /x) `id`; \"q\" 'q'\nlevel=error");
  for (char c : std::string("$`;\"'\n")) {
    // Only the wrapping quotes may remain.
    if (c == '"') {
      EXPECT_EQ(std::count(v.begin(), v.end(), '"'), 2) << v;
    } else {
      EXPECT_EQ(v.find(c), std::string::npos) << "'" << c << "' in " << v;
    }
  }
  EXPECT_EQ(v.front(), '"');
  EXPECT_EQ(v.back(), '"');
}

// Each line starts with the time in UTC, RFC 3339 with milliseconds (common/utc_time.hpp).
TEST(Logger, LinesStartWithAMillisecondUtcStamp) {
  test::TempDir dir;
  auto path = dir / "gf/stamp.log";
  {
    Logger log;
    ASSERT_TRUE(log.open_file(path));
    log.info("test.stamp", {});
  }
  auto text = read_file(path).value_or("");
  EXPECT_TRUE(std::regex_search(
      text, std::regex(
                R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z level=info event=test\.stamp\n$)")))
      << text;
}

TEST(Logger, PodBytesStayOnOneLineAsData) {
  test::TempDir dir;
  auto path = dir / "gf/runtime.log";
  {
    Logger log;
    ASSERT_TRUE(log.open_file(path));
    log.info("runtime.ignored",
             {{"what", "NVIDIA_VISIBLE_DEVICES=x\n2026 level=error event=forged $(id)"}});
  }
  auto text = read_file(path).value_or("");
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_EQ(text.find("$("), std::string::npos) << text;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(path.parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "the log's own directory is made 0700";
}

// Each thing a pod with a hostPath over the log directory could leave at the log's path, and at
// each directory component: the logger refuses it and nothing lands outside.
class LoggerPlanted : public ::testing::Test {
 protected:
  test::TempDir m_dir;
  std::filesystem::path m_outside = m_dir.write("outside/ld.so.preload", "");
  std::filesystem::path m_log = m_dir / "logs/gpufence/runtime.log";
  void SetUp() override { std::filesystem::create_directories(m_log.parent_path()); }
  void expect_refused_and_untouched() {
    Logger log;
    auto st = log.open_file(m_log);
    EXPECT_FALSE(st) << "opened a planted " << m_log;
    log.info("runtime.ignored", {{"what", "/var/log/pwn.so"}});  // to stderr, not the plant
    EXPECT_EQ(read_file(m_outside).value_or("?"), "");
  }
};

TEST_F(LoggerPlanted, SymlinkAtTheFile) {
  std::filesystem::create_symlink(m_outside, m_log);
  expect_refused_and_untouched();
}

TEST_F(LoggerPlanted, DanglingSymlinkAtTheFile) {
  std::filesystem::create_symlink(m_dir / "outside/new-file", m_log);
  expect_refused_and_untouched();
  EXPECT_FALSE(std::filesystem::exists(m_dir / "outside/new-file"));
}

TEST_F(LoggerPlanted, HardLinkAtTheFile) {
  std::filesystem::create_hard_link(m_outside, m_log);
  expect_refused_and_untouched();
}

TEST_F(LoggerPlanted, FifoAtTheFileNeverBlocks) {
  ASSERT_EQ(::mkfifo(m_log.c_str(), 0600), 0);
  expect_refused_and_untouched();  // an open for writing would block here, no reader
}

TEST_F(LoggerPlanted, DirectoryAtTheFile) {
  std::filesystem::create_directory(m_log);
  expect_refused_and_untouched();
}

TEST_F(LoggerPlanted, FileOfAnotherUser) {
  test::TempDir d;
  auto path = d.write("runtime.log", "");
  if (::geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  Logger log;
  EXPECT_FALSE(log.open_file(path));
}

TEST_F(LoggerPlanted, SymlinkAtTheLogDirectory) {
  std::filesystem::remove_all(m_log.parent_path());
  std::filesystem::create_symlink(m_outside.parent_path(), m_log.parent_path());
  expect_refused_and_untouched();
  EXPECT_FALSE(std::filesystem::exists(m_outside.parent_path() / "runtime.log"));
}

TEST_F(LoggerPlanted, SymlinkAtAParentDirectory) {
  std::filesystem::remove_all(m_dir / "logs");
  std::filesystem::create_directories(m_outside.parent_path() / "gpufence");
  std::filesystem::create_symlink(m_outside.parent_path(), m_dir / "logs");
  expect_refused_and_untouched();
  EXPECT_FALSE(std::filesystem::exists(m_outside.parent_path() / "gpufence/runtime.log"));
}

TEST_F(LoggerPlanted, MissingDirectoryIsMadeOnlyAsTheLastComponent) {
  std::filesystem::remove_all(m_dir / "logs");
  Logger log;
  EXPECT_FALSE(log.open_file(m_log)) << "only the log's own directory is made, not its parents";
  std::filesystem::create_directories(m_dir / "logs");
  EXPECT_TRUE(log.open_file(m_log));
}

TEST(OpenAppendChecked, AppendsToItsOwnRegularFile) {
  test::TempDir dir;
  auto path = dir.write("log.json", "a\n");
  for (auto symlinks : {Symlinks::none, Symlinks::in_parent_only}) {
    auto fd = open_append_checked(path, symlinks, 0644);
    ASSERT_TRUE(fd) << fd.error().message;
    ASSERT_EQ(::write(fd->fd, "b\n", 2), 2);
  }
  EXPECT_EQ(read_file(path).value_or(""), "a\nb\nb\n");
}

TEST(OpenAppendChecked, ParentLinkIsFollowedOnlyWhenAllowed) {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "real");
  std::filesystem::create_symlink(dir / "real", dir / "link");
  EXPECT_FALSE(open_append_checked(dir / "link/f", Symlinks::none, 0644));
  EXPECT_TRUE(open_append_checked(dir / "link/f", Symlinks::in_parent_only, 0644));
  EXPECT_TRUE(std::filesystem::exists(dir / "real/f"));
}

// A container's root owns (fsuid 0) every root file it can open, so it can take a lease without
// CAP_LEASE; opening the leased file for writing would wait lease-break-time (45 s) per create.
TEST_F(LoggerPlanted, ALeaseOnTheLogFailsAtOnceInsteadOfHolding) {
  ASSERT_TRUE(Logger().open_file(m_log));  // the log exists, ours
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t holder = ::fork();
  if (holder == 0) {
    ::signal(SIGIO, SIG_IGN);
    int fd = ::open(m_log.c_str(), O_RDONLY);
    char ok = (fd >= 0 && ::fcntl(fd, F_SETLEASE, F_RDLCK) == 0) ? 'y' : 'n';
    [[maybe_unused]] auto n = ::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  if (ok != 'y') {
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    GTEST_SKIP() << "this filesystem takes no leases";
  }
  auto fd = open_append_checked(m_log, Symlinks::none, 0600);
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  EXPECT_FALSE(fd) << "waited the lease out instead of failing at once";
}
