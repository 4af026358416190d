#include <gtest/gtest.h>
#include <sys/stat.h>

#include "common/file.hpp"
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

TEST(File, FailedWriteLeavesTheOldFile) {
  test::TempDir dir;
  auto path = dir.write("sub/config.json", "keep me");
  auto missing_dir = dir / "nope/config.json";
  auto st = write_file_atomic(missing_dir, "x");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("nope"), std::string::npos);
  EXPECT_EQ(read_file(path).value(), "keep me");
}

TEST(File, ReadsProcFilesWhoseSizeIsZero) {
  auto status = read_file("/proc/self/status");
  ASSERT_TRUE(status);
  EXPECT_NE(status->find("CapBnd"), std::string::npos);
}
