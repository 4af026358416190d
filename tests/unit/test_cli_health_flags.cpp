// The health flags the device plugin and gpufence-dra share (src/cli/health_flags.cpp), as an
// operator mistypes them: each bad value stops the start with exit 2, naming the flag and the
// value, before anything is opened or registered.
#include <gtest/gtest.h>

#include "support/test_support.hpp"

using namespace gpufence;

namespace {

struct BadFlag {
  std::vector<std::string> args;
  std::string says;
};

void expect_refused(const std::string& binary, std::vector<std::string> prefix,
                    const BadFlag& bad) {
  std::vector<std::string> argv{test::bin_path(binary)};
  argv.insert(argv.end(), prefix.begin(), prefix.end());
  argv.insert(argv.end(), bad.args.begin(), bad.args.end());
  // No NVML anywhere: a flag that slipped through fails later, on the library, not on the flag.
  auto r = test::run_command(argv, {"GPUFENCE_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"});
  EXPECT_EQ(r.exit_code, 2) << binary << " " << bad.args[0] << ": " << r.err;
  EXPECT_NE(r.err.find(bad.says), std::string::npos)
      << binary << " " << bad.args[0] << ": " << r.err;
}

const std::vector<BadFlag> kBadFlags = {
    {{"--ignore-xids", "13,x"}, "--ignore-xids: XID 'x' is not a number"},
    {{"--ignore-xids", "-5"}, "--ignore-xids: XID '-5' is not a number"},
    {{"--permanent-xids", "79,,80"}, "--permanent-xids: XID '' is not a number"},
    {{"--health-recovery", "forever"}, "--health-recovery: duration 'forever'"},
    {{"--health-recovery", "5x"}, "--health-recovery: duration '5x' needs a unit"},
};

}  // namespace

TEST(CliHealthFlags, TheDevicePluginRefusesBadValuesNamingTheFlag) {
  for (const auto& bad : kBadFlags) expect_refused("gpufence-device-plugin", {}, bad);
}

TEST(CliHealthFlags, GpufenceDraRefusesTheSameAndItsOwn) {
  auto flags = kBadFlags;
  flags.push_back({{"--no-execute-xids", "zz"}, "--no-execute-xids: XID 'zz' is not a number"});
  for (const auto& bad : flags) expect_refused("gpufence-dra", {"--node-name", "n1"}, bad);
}
