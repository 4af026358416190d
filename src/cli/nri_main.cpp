// gpufence-nri: containerd's NRI plugin that enforces the kubelet's GPU allocation in every
// container containerd creates, with no RuntimeClass and nothing on the exec path (docs/nri.md).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "common/hostfs.hpp"
#include "common/paths.hpp"
#include "common/process.hpp"
#include "common/strings.hpp"
#include "gpu/nvml_inventory.hpp"
#include "nri/adjust.hpp"
#include "nri/fence.hpp"
#include "nri/handler.hpp"
#include "nri/run.hpp"

using namespace gpufence;
namespace gnri = gpufence::nri;

namespace {

// gpufence-runtime for the hooks: beside this binary, else beside a link on the way to it.
// containerd execs plugin_path/10-gpufence-nri -> /usr/local/bin/gpufence-nri ->
// /usr/local/lib/gpufence/gpufence-nri-<hash> (what install makes, docs/install.md), with no
// arguments: only the middle link has gpufence-runtime (install's link) beside it.
std::string default_hook_binary(const char* argv0) {
  namespace fs = std::filesystem;
  auto beside = [](const fs::path& p) { return p.parent_path() / "gpufence-runtime"; };
  fs::path self_sibling = beside(self_executable());
  if (::access(self_sibling.c_str(), X_OK) == 0) return self_sibling.string();
  if (argv0 != nullptr && std::string_view(argv0).find('/') != std::string_view::npos) {
    fs::path p = argv0;
    for (int hop = 0; hop < 8; ++hop) {
      if (::access(beside(p).c_str(), X_OK) == 0) return beside(p).string();
      std::error_code ec;
      auto target = fs::read_symlink(p, ec);
      if (ec) break;
      p = target.is_absolute() ? target : p.parent_path() / target;
    }
  }
  return self_sibling.string();
}

int run(int argc, char** argv) {
  CLI::App app{
      "gpufence-nri: an NRI plugin for containerd (1.7 with NRI enabled, 2.x) that gives every "
      "container exactly the GPUs the kubelet allocated to it: the same decision as "
      "gpufence-runtime, applied as an NRI adjustment inside containerd's CreateContainer.\n"
      "Configuration: " +
      std::string(paths::kRuntimeConfig) +
      " or $GPUFENCE_RUNTIME_CONFIG (deploy/"
      "runtime.toml). Started by containerd from its plugin_path (NN-name, fd 3 in "
      "$NRI_PLUGIN_SOCKET), it serves that one connection and starts a keeper that brings it "
      "back through --socket whenever it is gone; started on its own, it connects to --socket "
      "and reconnects whenever containerd restarts. Launched as NN-gpufence-fence (or with "
      "--fence) it is the fence: a validator (containerd 2.2+) that rejects every container "
      "gpufence-nri did not decide. Its status for `gpufence doctor` goes to [nri] status_file "
      "(default " +
      std::string(paths::kNriStatus) + "). docs/nri.md"};
  gnri::ServeOptions serve;
  std::string socket_path;
  std::string hook_binary;
  bool fence = false, once = false, keeper = false;
  app.add_option("--socket", socket_path,
                 "containerd's NRI socket (socket_path; default [nri] socket, "
                 "/var/run/nri/nri.sock)");
  app.add_option("--name", serve.session.name,
                 "plugin name (default gpufence-nri, the fence: "
                 "gpufence-fence)");
  app.add_option("--index", serve.session.index,
                 "two-digit plugin index (order among plugins; default 10, the fence: 20)");
  app.add_option(
      "--hook-binary", hook_binary,
      "gpufence-runtime as the host sees it, for the OCI hooks the decision adds "
      "(default: gpufence-runtime beside this binary, or beside a link on the way to it)");
  app.add_flag("--fence", fence, "run as the fence (validator) instead of the decider");
  app.add_flag("--once", once,
               "serve one connection through --socket, then exit (a keeper "
               "starts these)");
  app.add_flag("--keeper", keeper,
               "keep the role served: start --once servers whenever none "
               "holds the role's lock in [nri] keeper_dir");
  CLI11_PARSE(app, argc, argv);

  auto config = load_runtime_config();
  if (!config) {
    std::cerr << "gpufence-nri: " << config.error().message << "\n";
    return 1;
  }
  auto level = parse_log_level(config->log_level);
  Logger log(level ? *level : LogLevel::info);
  if (!config->log_file.empty()) {
    if (auto st = log.open_file(config->log_file); !st) {
      log.warn("nri.log_file_unavailable", {{"error", st.error().message}});
    }
  }

  // Launched by containerd: fd 3, name and index from the environment (nri@v0.12.0:
  // pkg/adaptation/plugin.go newLaunchedPlugin).
  const char* launched_fd = std::getenv("NRI_PLUGIN_SOCKET");
  if (launched_fd) {
    if (const char* n = std::getenv("NRI_PLUGIN_NAME")) serve.session.name = n;
    if (const char* i = std::getenv("NRI_PLUGIN_IDX")) serve.session.index = i;
    serve.mode = gnri::ServeMode::launched;
    serve.launched_fd = std::atoi(launched_fd);
    if (serve.launched_fd < 3) {
      log.error("nri.bad_socket_fd", {{"NRI_PLUGIN_SOCKET", launched_fd}});
      return 1;
    }
  } else {
    serve.mode = keeper ? gnri::ServeMode::keeper
                 : once ? gnri::ServeMode::once
                        : gnri::ServeMode::external;
  }
  if (fence || serve.session.name == gnri::kFencePluginName) {
    serve.role = gnri::Role::fence;
    if (serve.session.name == "gpufence-nri") serve.session.name = gnri::kFencePluginName;
    if (!launched_fd && app.count("--index") == 0) serve.session.index = "20";
  }
  serve.socket = socket_path.empty() ? config->nri_socket : socket_path;
  serve.files.dir = config->nri_keeper_dir;
  serve.self_exe = self_executable();

  if (serve.role == gnri::Role::fence) {
    log.info("nri.started", {{"role", "fence"}});
    gnri::FenceHandler handler(log, "gpufence-nri");
    return gnri::serve(
        serve, handler, [](gnri::NriState) {}, log);
  }
  if (hook_binary.empty()) hook_binary = default_hook_binary(argc > 0 ? argv[0] : nullptr);
  if (serve.mode != gnri::ServeMode::keeper)
    log.info("nri.started", {{"role", "decider"}, {"hook_binary", hook_binary}});
  CgroupMountPoints cgroup_mounts;  // read again only after the host's mount table changed
  ShimContext ctx{*config, log, host_nvml_inventory(config->nvml_library), hook_binary,
                  CdiEdits::already_injected};
  ctx.cgroup_mounts = &cgroup_mounts;
  gnri::GpufenceHandler handler(
      ctx, launched_fd ? cat("launched by containerd (fd ", launched_fd, ")") : serve.socket);
  handler.inventory_for = [](const std::string& library) { return host_nvml_inventory(library); };
  return gnri::serve(
      serve, handler, [&handler](gnri::NriState state) { handler.disconnected(state); }, log);
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpufence-nri: " << e.what() << "\n";
    return 1;
  }
}
