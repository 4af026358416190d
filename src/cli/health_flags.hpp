// The GPU health flags gpufence-device-plugin and gpufence-dra share (docs/monitoring.md,
// "Health"), declared and read in one place.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/error.hpp"
#include "deviceplugin/options.hpp"

namespace gpufence::cli {

struct HealthFlags {
  std::string ignore_xids, permanent_xids = "79", recovery = "off";
  bool disable = false;
  CLI::Option* ignore = nullptr;  // given at all: "" is a list too (every XID counts)
};

void add_health_flags(CLI::App& app, HealthFlags& flags);
// The options the flags say, and NVIDIA's DP_DISABLE_HEALTHCHECKS ("all"/"xids" disables, a
// list adds ignored XIDs), honoured for drop-in familiarity. Errors name the flag.
Result<HealthOptions> health_options(const HealthFlags& flags);

}  // namespace gpufence::cli
