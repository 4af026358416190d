#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>

#include "cli/commands.hpp"
#include "common/file.hpp"
#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "launch/launch.hpp"

extern char** environ;

namespace gpufence::cli {
namespace {

struct ConfigJob {
  std::map<std::string, std::string>
      copies;  // original path -> writable copy, where one was needed
  std::set<std::string> done;
  int rewritten = 0;
  std::filesystem::path copy_dir;
};

// Rewrites `path` and the nvinfer configs it references (children first, so the parent can point
// at their copies). A read-only file (a ConfigMap) is written to a copy instead.
Status process_config(const std::filesystem::path& path, size_t allocated, ConfigJob& job,
                      int depth) {
  if (depth > 4 || job.done.contains(path.string())) return {};
  job.done.insert(path.string());
  auto text = read_file(path);
  if (!text) return std::unexpected(text.error());
  const ConfigFormat format = config_format(path.string());
  auto rw = rewrite_gpu_ids(format, *text, allocated, path.string());
  if (!rw) return std::unexpected(rw.error());
  std::map<std::string, std::string> renames;
  for (const auto& ref : rw->referenced) {
    std::filesystem::path child = std::filesystem::path(ref).is_absolute()
                                      ? std::filesystem::path(ref)
                                      : path.parent_path() / ref;
    if (!std::filesystem::exists(child)) continue;  // DeepStream reports its own missing files
    if (auto st = process_config(child, allocated, job, depth + 1); !st) return st;
    if (auto it = job.copies.find(child.string()); it != job.copies.end())
      renames[ref] = it->second;
  }
  std::string out = rw->text;
  if (!renames.empty()) {
    auto renamed = rename_config_refs(format, rw->text, renames, path.string());
    if (!renamed) return std::unexpected(renamed.error());
    out = *renamed;
  }
  job.rewritten += rw->changed;
  if (out == *text) return {};
  if (auto st = write_file_atomic(path, out); st) return {};
  // Not writable here: keep the rewritten text in a copy and point users of the file at it.
  std::error_code ec;
  std::filesystem::create_directories(job.copy_dir, ec);
  auto copy = job.copy_dir / (std::to_string(job.copies.size()) + "-" + path.filename().string());
  if (auto st = write_file_atomic(copy, out, Durability::none); !st) return st;
  job.copies[path.string()] = copy.string();
  return {};
}

}  // namespace

std::vector<Command> add_launch_command(CLI::App& app, Context& ctx) {
  struct Args {
    std::vector<std::string> configs, command;
    std::string markers = "/var/run/nvidia-container-devices";
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
         ConfigJob job;
         job.copy_dir = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / "gpufence-launch";
         for (const auto& c : args->configs) {
           if (auto st = process_config(c, uuids->size(), job, 0); !st) {
             std::cerr << "gpufence launch: " << st.error().message << "\n";
             return 2;
           }
         }
         std::vector<std::string> argv = args->command;
         for (auto& a : argv) {
           if (auto it = job.copies.find(a); it != job.copies.end()) a = it->second;
         }
         std::string list = join(*uuids, ",");
         ::setenv("CUDA_VISIBLE_DEVICES", list.c_str(), 1);
         std::cerr << "gpufence launch: allocated " << list << "; rewrote " << job.rewritten
                   << " gpu-id key(s)"
                   << (job.copies.empty()
                           ? ""
                           : " (read-only configs copied to " + job.copy_dir.string() + ")")
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
