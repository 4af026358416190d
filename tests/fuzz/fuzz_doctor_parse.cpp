// libFuzzer target: the doctor's /proc and cgroup parsers (doctor/parse.hpp), each fed the same
// bytes: /proc/<pid>/cgroup, environ, status, mountinfo, v1 devices.list, an OCI spec's device
// rules, and a DeepStream config; and the runtime's mountinfo reader with the cgroup-mounts hook's
// judgement (runtime/mount_guard.hpp): whatever it accepts holds no writable cgroup filesystem in
// the root.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "doctor/parse.hpp"
#include "runtime/mount_guard.hpp"

using namespace gpufence;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  static const std::set<unsigned> gpu_minors = {0, 1, 2, 255};

  // A container id is always 64 hex digits (parse.hpp): the doctor looks it up by that.
  if (auto id = container_id_from_cgroup(text)) {
    if (id->size() != 64) std::abort();
    for (unsigned char c : *id) {
      if (!std::isxdigit(c)) std::abort();
    }
  }
  (void)cgroup_path(text, "devices");
  (void)cgroup_path(text, "");
  (void)parse_environ(text);
  (void)bounding_caps(text);
  (void)status_caps(text, "CapEff");
  // One entry per sysfs mount line, each one line: a report line cannot be forged from mountinfo.
  for (const auto& m : writable_sysfs_mounts(text)) {
    if (m.find('\n') != std::string::npos || !m.ends_with(")")) std::abort();
  }
  if (auto minors = openable_gpu_minors_from_devices_list(text, gpu_minors)) {
    for (unsigned m : *minors) {
      if (!gpu_minors.contains(m)) std::abort();
    }
  }
  for (unsigned m : openable_gpu_minors_from_oci_rules(text, gpu_minors)) {
    if (!gpu_minors.contains(m)) std::abort();
  }
  (void)deepstream_gpu_ids(text);
  for (auto ns : {CgroupNamespace::own, CgroupNamespace::host}) {
    if (!check_container_cgroup_mounts(text, "/r", ns)) continue;
    for (const auto& m : parse_mountinfo(text)) {
      bool inside = m.mount_point == "/r" || m.mount_point.starts_with("/r/");
      if (m.is_cgroupfs() && inside && !m.read_only()) std::abort();
    }
  }
  return 0;
}
