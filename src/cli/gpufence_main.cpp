// gpufence: the node-side command line. Each subcommand lives in its own cmd_*.cpp.
#include <iostream>

#include "cli/commands.hpp"

int main(int argc, char** argv) try {
  using namespace gpufence;
  cli::Context ctx;
  CLI::App app{"gpufence: exclusive, provable GPU allocation on Kubernetes nodes"};
  app.require_subcommand(1);
  // Global flags work after the subcommand too: `gpufence doctor --host-root /host`.
  app.fallthrough();
  app.add_option("--host-root", ctx.host_root,
                 "Read the host's /proc, /sys, /dev, /etc under this root")
      ->capture_default_str();
  app.add_option("--nvml-library", ctx.nvml_library,
                 "NVML library to dlopen (default: $GPUFENCE_NVML_LIBRARY or libnvidia-ml.so.1)");
  app.add_option("--log-file", ctx.log_file, "Append logs to this file instead of stderr");
  app.add_option("--log-level", ctx.log_level, "debug, info, warn, error or off")
      ->capture_default_str();

  std::vector<cli::Command> commands;
  for (auto& c : cli::add_list_command(app, ctx)) commands.push_back(c);
  for (auto& c : cli::add_setup_commands(app, ctx)) commands.push_back(c);
  for (auto& c : cli::add_cdi_commands(app, ctx)) commands.push_back(c);
  for (auto& c : cli::add_doctor_command(app, ctx)) commands.push_back(c);
  for (auto& c : cli::add_launch_command(app, ctx)) commands.push_back(c);
  for (auto& c : cli::add_autoscale_command(app, ctx)) commands.push_back(c);
  for (auto& c : cli::add_install_commands(app, ctx)) commands.push_back(c);

  // `launch ... -- APP ARGS`: what follows "--" is the app's own command line, whatever flags it
  // holds, so it never reaches CLI11.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "launch") continue;
    for (int j = i + 1; j < argc; ++j) {
      if (std::string_view(argv[j]) != "--") continue;
      ctx.after_double_dash.assign(argv + j + 1, argv + argc);
      argc = j;
      break;
    }
    break;
  }
  CLI11_PARSE(app, argc, argv);

  auto level = parse_log_level(ctx.log_level);
  if (!level) {
    std::cerr << "gpufence: " << level.error().message << "\n";
    return 2;
  }
  ctx.log.set_level(*level);
  if (!ctx.log_file.empty()) {
    if (auto st = ctx.log.open_file(ctx.log_file); !st) {
      std::cerr << "gpufence: " << st.error().message << "\n";
      return 2;
    }
  }
  for (const auto& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  std::cerr << app.help();
  return 2;
} catch (const std::exception& e) {
  std::cerr << "gpufence: internal error: " << e.what() << "\n";
  return 2;
}
