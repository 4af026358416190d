// gpufence-nri's status file (src/nri/status.hpp): the one format the plugin writes and the doctor
// reads, the pid-reuse check's parse of /proc/<pid>/stat, and where root writes it: never through
// a symbolic link.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include "common/file.hpp"
#include "nri/status.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace gpufence::nri;

namespace {

NriStatus sample() {
  NriStatus s;
  s.pid = 4242;
  s.start_time = 987654;
  s.state = NriState::connected;
  s.since = "2026-12-02T03:50:00Z";
  s.socket = "/run/nri/nri.sock";
  s.runtime = "containerd";
  s.runtime_version = "v2.3.4";
  s.nri_version = "v0.12.0";
  s.device_rules = true;
  s.synchronized_at = "2026-12-02T03:50:01Z";
  s.containers = 3;
  s.without_gpu_edit = 1;
  s.unenforced.push_back({"c1", "ns/pod", "app\n$(evil)", "", "would grant GPU-1"});
  return s;
}

}  // namespace

// The status file's stamps: RFC 3339 in UTC, whole seconds.
TEST(NriStatusFile, StampsAreWholeSecondsUtc) {
  EXPECT_TRUE(
      std::regex_match(utc_now_text(), std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)")))
      << utc_now_text();
}

TEST(NriStatusFile, RoundTrips) {
  auto parsed = parse_nri_status(render_nri_status(sample()), "status");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(*parsed, sample());
}

TEST(NriStatusFile, BrokenFilesAreErrorsNotDefaults) {
  EXPECT_FALSE(parse_nri_status("", "s"));
  EXPECT_FALSE(parse_nri_status("[]", "s"));
  EXPECT_FALSE(parse_nri_status(R"({"pid": 1})", "s"));  // no start_time, no state
  EXPECT_FALSE(parse_nri_status(R"({"pid": 0, "start_time": 1, "state": "connected"})", "s"));
  EXPECT_FALSE(parse_nri_status(R"({"pid": 7, "start_time": 1, "state": "fine"})", "s"));
  EXPECT_FALSE(parse_nri_status(R"({"pid": "7", "start_time": 1, "state": "connected"})", "s"));
  EXPECT_TRUE(parse_nri_status(R"({"pid": 7, "start_time": 1, "state": "exited"})", "s"));
}

TEST(NriStatusFile, StartTimeIsCountedAfterTheCommandsLastParenthesis) {
  // A command name may hold ") S 1 2": fields are counted after the last ')'.
  std::string fields;
  for (int f = 3; f <= 52; ++f) fields += " " + std::to_string(f == 22 ? 777 : f);
  EXPECT_EQ(parse_proc_start_time("12 (a) S 1 2 3 (b)" + fields), 777u);
  EXPECT_FALSE(parse_proc_start_time("12 (short) S 1 2"));
  EXPECT_FALSE(parse_proc_start_time("no parenthesis at all"));
  auto self = read_file("/proc/self/stat");
  ASSERT_TRUE(self);
  EXPECT_TRUE(parse_proc_start_time(*self));
}

TEST(NriStatusFile, RootNeverWritesItThroughALink) {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "elsewhere");
  // A link as a directory of the path: refused, nothing written where it points.
  std::filesystem::create_directory_symlink(dir / "elsewhere", dir / "state");
  EXPECT_FALSE(write_nri_status((dir / "state/nri-status.json").string(), sample()));
  EXPECT_FALSE(std::filesystem::exists(dir / "elsewhere/nri-status.json"));
  // A link planted at the file's name is replaced, never followed.
  std::filesystem::create_directories(dir / "own");
  dir.write("target", "keep");
  std::filesystem::create_symlink(dir / "target", dir / "own/nri-status.json");
  ASSERT_TRUE(write_nri_status((dir / "own/nri-status.json").string(), sample()));
  EXPECT_EQ(*read_file(dir / "target"), "keep");
  EXPECT_FALSE(std::filesystem::is_symlink(dir / "own/nri-status.json"));
  // A missing last directory is made 0700.
  ASSERT_TRUE(write_nri_status((dir / "made/nri-status.json").string(), sample()));
  EXPECT_EQ(std::filesystem::status(dir / "made").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  EXPECT_FALSE(write_nri_status("relative/nri-status.json", sample()));
}
