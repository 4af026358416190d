// The stamps each reader expects, pinned at fixed time points: runc's log (logrus,
// RFC3339Nano), Kubernetes' MicroTime and Time, gpufence's own log, the backup names.
#include <gtest/gtest.h>

#include "common/utc_time.hpp"

using namespace gpufence;
using std::chrono::system_clock;

namespace {

// 2026-12-02T06:35:35.123456789Z
system_clock::time_point fixed() {
  return system_clock::time_point(std::chrono::seconds(1796193335)) +
         std::chrono::nanoseconds(123456789);
}

}  // namespace

TEST(UtcTime, Rfc3339AtEachPrecision) {
  EXPECT_EQ(utc_rfc3339(fixed(), SubSecond::none), "2026-12-02T06:35:35Z");
  EXPECT_EQ(utc_rfc3339(fixed(), SubSecond::millis), "2026-12-02T06:35:35.123Z");
  EXPECT_EQ(utc_rfc3339(fixed(), SubSecond::micros), "2026-12-02T06:35:35.123456Z");
  EXPECT_EQ(utc_rfc3339(fixed(), SubSecond::nanos), "2026-12-02T06:35:35.123456789Z");
}

TEST(UtcTime, CompactStampForFileNames) {
  EXPECT_EQ(utc_compact_stamp(fixed()), "20261202T063535Z");
  EXPECT_EQ(utc_compact_stamp(system_clock::time_point{}), "19700101T000000Z");
}

// Fixed width: zeros are kept, and a fraction is cut, never rounded up into the next second.
TEST(UtcTime, FractionKeepsItsZerosAndIsNeverRounded) {
  const system_clock::time_point epoch{};
  EXPECT_EQ(utc_rfc3339(epoch, SubSecond::nanos), "1970-01-01T00:00:00.000000000Z");
  EXPECT_EQ(utc_rfc3339(epoch, SubSecond::millis), "1970-01-01T00:00:00.000Z");
  const auto almost = epoch + std::chrono::seconds(59) + std::chrono::nanoseconds(999'999'999);
  EXPECT_EQ(utc_rfc3339(almost, SubSecond::none), "1970-01-01T00:00:59Z");
  EXPECT_EQ(utc_rfc3339(almost, SubSecond::millis), "1970-01-01T00:00:59.999Z");
  EXPECT_EQ(utc_rfc3339(almost, SubSecond::micros), "1970-01-01T00:00:59.999999Z");
  EXPECT_EQ(utc_rfc3339(epoch + std::chrono::microseconds(7), SubSecond::micros),
            "1970-01-01T00:00:00.000007Z");
}

// Before 1970 the second is floored, so the fraction stays a fraction (truncating toward zero,
// as runc_log's and micro_time's own copies did, printed "00:00:00.-00000001Z").
TEST(UtcTime, BeforeTheEpochTheFractionStaysPositive) {
  const auto before = system_clock::time_point{} - std::chrono::nanoseconds(1);
  EXPECT_EQ(utc_rfc3339(before, SubSecond::nanos), "1969-12-31T23:59:59.999999999Z");
  EXPECT_EQ(utc_rfc3339(before, SubSecond::micros), "1969-12-31T23:59:59.999999Z");
  EXPECT_EQ(utc_compact_stamp(before), "19691231T235959Z");
}

// Leap day and end of year, where a hand-made calendar would slip.
TEST(UtcTime, CalendarEdges) {
  // 2028-02-29T23:59:59Z and one second later.
  const system_clock::time_point leap{std::chrono::seconds(1835481599)};
  EXPECT_EQ(utc_rfc3339(leap, SubSecond::none), "2028-02-29T23:59:59Z");
  EXPECT_EQ(utc_rfc3339(leap + std::chrono::seconds(1), SubSecond::none), "2028-03-01T00:00:00Z");
  const system_clock::time_point new_year{std::chrono::seconds(1798761600)};
  EXPECT_EQ(utc_compact_stamp(new_year), "20270101T000000Z");
}

TEST(UtcTime, Rfc3339ParsesBackToTheSecond) {
  auto t = std::chrono::system_clock::from_time_t(1796621017);
  auto back = parse_utc_rfc3339(utc_rfc3339(t, SubSecond::none));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, t);
  EXPECT_EQ(parse_utc_rfc3339("2026-12-07T05:23:37.123Z"), t);
  for (const char* bad : {"", "2026-12-07T05:23:37", "2026-12-07 05:23:37Z",
                          "2026-12-07T05:23:37.Z", "2026-12-07T05:23:37.1xZ", "yesterday"})
    EXPECT_FALSE(parse_utc_rfc3339(bad)) << bad;
}
