#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "cli/commands.hpp"
#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"
#include "launch/config_walk.hpp"
#include "launch/launch.hpp"

extern char** environ;

namespace gpufence::cli {

std::vector<Command> add_launch_command(CLI::App& app, Context& ctx) {
  struct Args {
    std::vector<std::string> configs, command;
    std::string markers = std::string(kMountMarkerRoot);
    bool allow_extra = false;
  };
  auto args = std::make_shared<Args>();
  auto* l = app.add_subcommand(
      "launch",
      "Container entrypoint: point DeepStream's gpu-id at the allocated GPU, then exec the app");
  l->add_option("--config", args->configs,
                "DeepStream config to rewrite (repeatable; nvinfer configs it names follow)");
  l->add_option("--markers-dir", args->markers, "Where the kubelet mounts GPU markers")
      ->capture_default_str();
  l->add_flag("--allow-extra-gpus", args->allow_extra,
              "Start even if the container can open GPUs it was not allocated");
  // Everything from the app's name on is the app's, its own flags included.
  l->prefix_command();
  l->footer(
      "Example (container command):\n"
      "  gpufence launch --config /opt/app/ds.txt -- deepstream-app -c /opt/app/ds.txt\n"
      "It sets CUDA_VISIBLE_DEVICES to the allocated UUIDs, rewrites gpu-id values (key files and\n"
      ".yml/.yaml configs) to count within them (0 with one GPU), changing only the values that\n"
      "change, writes a copy under $TMPDIR when a config is read-only (and passes the copy's path\n"
      "to the app), and refuses to start (exit 1) if the container can open more GPUs than it was\n"
      "allocated, or (exit 2) if CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and the mount\n"
      "markers name different GPUs.");

  auto app_remaining = [l](const std::shared_ptr<Args>&) { return l->remaining(); };
  return {
      {l, [args, &ctx, app_remaining]() -> int {
         HostFs host(ctx.host_root);
         for (const auto& a : app_remaining(args)) args->command.push_back(a);
         for (const auto& a : ctx.after_double_dash) args->command.push_back(a);
         if (args->command.empty()) {
           std::cerr
               << "gpufence launch: no command to run (gpufence launch [flags] -- APP [ARGS...])\n";
           return 2;
         }
         std::map<std::string, std::string> env;
         for (char** e = environ; *e; ++e) {
           std::string_view kv = *e;
           auto eq = kv.find('=');
           if (eq != std::string_view::npos)
             env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
         }
         auto uuids =
             allocated_uuids(env, host.list(args->markers).value_or(std::vector<std::string>{}));
         if (!uuids) {
           std::cerr << "gpufence launch: " << uuids.error().message << "\n";
           return 2;
         }
         size_t openable = openable_gpu_count(host);
         if (openable > uuids->size() && !args->allow_extra) {
           std::cerr << "gpufence launch: refusing to start: this container can open " << openable
                     << " GPUs but was allocated " << uuids->size() << " (" << join(*uuids, ",")
                     << "); GPU isolation is not enforced on this node (run `gpufence doctor`)\n";
           return 1;
         }
         const char* tmp = std::getenv("TMPDIR");
         const std::filesystem::path copy_dir =
             std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / "gpufence-launch";
         auto files = local_config_files();
         auto rewrites = rewrite_configs(args->configs, uuids->size(), copy_dir, *files);
         if (!rewrites) {
           std::cerr << "gpufence launch: " << rewrites.error().message << "\n";
           return 2;
         }
         std::vector<std::string> argv = point_at_copies(args->command, *rewrites);
         std::string list = join(*uuids, ",");
         ::setenv("CUDA_VISIBLE_DEVICES", list.c_str(), 1);
         std::cerr << "gpufence launch: allocated " << list << "; rewrote " << rewrites->rewritten
                   << " gpu-id key(s)"
                   << (rewrites->copies.empty()
                           ? ""
                           : " (read-only configs copied to " + copy_dir.string() + ")")
                   << "; exec " << argv.front() << "\n";
         std::vector<char*> cargv;
         for (auto& a : argv) cargv.push_back(a.data());
         cargv.push_back(nullptr);
         ::execvp(cargv[0], cargv.data());
         std::cerr << "gpufence launch: exec " << argv.front() << ": " << std::strerror(errno)
                   << "\n";
         return 127;
       }}};
}

}  // namespace gpufence::cli
