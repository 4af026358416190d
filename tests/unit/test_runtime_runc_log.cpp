// The refusal line containerd reads back from the runtime's --log file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/file.hpp"
#include "runtime/runc_log.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

TEST(RuncLog, JsonLineIsWhatContainerdParses) {
  auto when = std::chrono::system_clock::time_point(std::chrono::seconds(1764583200)) +
              std::chrono::nanoseconds(123456789);
  std::string line = runc_log_line("json", "error", "refusing \"x\"\nnext", when);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line, whatever the message holds";
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["level"], "error");
  EXPECT_EQ(j["msg"], "refusing \"x\"\nnext");
  EXPECT_EQ(j["time"], "2025-12-01T10:00:00.123456789Z");
  EXPECT_EQ(line.substr(0, 19), R"({"level":"error","m)") << "runc's key order";
}

TEST(RuncLog, TextLineIsLogrusText) {
  auto when = std::chrono::system_clock::time_point(std::chrono::seconds(0));
  EXPECT_EQ(runc_log_line("text", "error", "no GPU", when),
            "time=\"1970-01-01T00:00:00.000000000Z\" level=error msg=\"no GPU\"\n");
}

TEST(RuncLog, AppendsAndNeverFollowsALink) {
  test::TempDir dir;
  std::string log = (dir.path() / "log.json").string();
  ASSERT_TRUE(append_runc_log(log, "a\n"));
  ASSERT_TRUE(append_runc_log(log, "b\n"));
  EXPECT_EQ(read_file(log).value_or(""), "a\nb\n");
  std::filesystem::create_symlink(dir.path() / "elsewhere", dir.path() / "link.json");
  EXPECT_FALSE(append_runc_log((dir.path() / "link.json").string(), "c\n"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "elsewhere"));
}
