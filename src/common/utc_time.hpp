// Wall-clock time as text, in UTC: the one place gpufence turns a time point into the stamps its
// logs, status files, Kubernetes objects, runc log lines and backup names carry.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace gpufence {

// Digits after the seconds. Each reader fixes its own: logrus (runc's log, which containerd
// reads back) writes nanoseconds (time.RFC3339Nano); Kubernetes' MicroTime (Events' eventTime,
// a Lease's renewTime) microseconds and metav1.Time whole seconds (apimachinery
// pkg/apis/meta/v1/micro_time.go, time.go); gpufence's own log milliseconds.
enum class SubSecond { none, millis, micros, nanos };

// RFC 3339 in UTC with "Z": "2026-12-02T06:35:35Z", or "2026-12-02T06:35:35.123Z" and so on with
// a fixed number of digits (trailing zeros kept, as Kubernetes and logrus keep them). The
// fraction is cut, never rounded, so a stamp never runs ahead of the time it names.
std::string utc_rfc3339(std::chrono::system_clock::time_point t, SubSecond digits);

// ISO 8601's basic format, "20261202T063535Z": no ':' or '-', so it fits in a file name (the
// setup backups' "<config>.bak-<stamp>").
std::string utc_compact_stamp(std::chrono::system_clock::time_point t);

// "2026-12-02T06:35:35Z" (a fraction before the Z is ignored) back to a time point; nullopt for
// anything else.
std::optional<std::chrono::system_clock::time_point> parse_utc_rfc3339(std::string_view text);

}  // namespace gpufence
