// The `gpufence` subcommands. Each file adds its subcommands to the app and returns a runner;
// main.cpp only parses and dispatches.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "common/log.hpp"

namespace gpufence::cli {

// What every subcommand shares; one per invocation, no globals.
struct Context {
  std::string host_root = "/";
  std::string nvml_library;
  std::string log_file;
  std::string log_level = "warn";
  Logger log{LogLevel::warn};
  std::vector<std::string> after_double_dash;  // `gpufence launch ... -- APP ARGS`: the app's argv
};

// A subcommand's body; returns the process exit code.
using Runner = std::function<int()>;
struct Command {
  CLI::App* app;
  Runner run;
};

std::vector<Command> add_list_command(CLI::App& app, Context& ctx);
std::vector<Command> add_setup_commands(CLI::App& app, Context& ctx);
std::vector<Command> add_cdi_commands(CLI::App& app, Context& ctx);
std::vector<Command> add_doctor_command(CLI::App& app, Context& ctx);
std::vector<Command> add_launch_command(CLI::App& app, Context& ctx);
std::vector<Command> add_autoscale_command(CLI::App& app, Context& ctx);
std::vector<Command> add_install_commands(CLI::App& app, Context& ctx);

}  // namespace gpufence::cli
