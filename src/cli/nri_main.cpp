// gpufence-nri: containerd's NRI plugin that enforces the kubelet's GPU allocation in every
// container containerd creates, with no RuntimeClass and nothing on the exec path (docs/nri.md).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "gpu/nvml_inventory.hpp"
#include "nri/adjust.hpp"
#include "nri/session.hpp"

using namespace gpufence;
namespace gnri = gpufence::nri;

namespace {

std::string self_exe() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
}

// gpufence-runtime for the hooks: beside this binary, else beside a link on the way to it.
// containerd execs plugin_path/10-gpufence-nri -> /usr/local/bin/gpufence-nri ->
// /usr/local/lib/gpufence/gpufence-nri-<hash> (what install makes, docs/install.md), with no
// arguments: only the middle link has gpufence-runtime (install's link) beside it.
std::string default_hook_binary(const char* argv0) {
  namespace fs = std::filesystem;
  auto beside = [](const fs::path& p) { return p.parent_path() / "gpufence-runtime"; };
  fs::path self_sibling = beside(self_exe());
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
      "Configuration: /etc/gpufence/runtime.toml or $GPUFENCE_RUNTIME_CONFIG (deploy/"
      "runtime.toml). Started by containerd from its plugin_path (NN-name, fd 3 in "
      "$NRI_PLUGIN_SOCKET), it serves that one connection; started on its own, it connects to "
      "--socket and reconnects whenever containerd restarts. Its status for `gpufence doctor` "
      "(connected, and the containers containerd created without it) goes to [nri] status_file "
      "(default /var/lib/gpufence/nri-status.json). docs/nri.md"};
  std::string socket_path = "/var/run/nri/nri.sock";
  gnri::SessionOptions options;
  std::string hook_binary;
  app.add_option("--socket", socket_path, "containerd's NRI socket (socket_path)")
      ->capture_default_str();
  app.add_option("--name", options.name, "plugin name")->capture_default_str();
  app.add_option("--index", options.index, "two-digit plugin index (order among plugins)")
      ->capture_default_str();
  app.add_option(
      "--hook-binary", hook_binary,
      "gpufence-runtime as the host sees it, for the OCI hooks the decision adds "
      "(default: gpufence-runtime beside this binary, or beside a link on the way to it)");
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
  if (hook_binary.empty()) hook_binary = default_hook_binary(argc > 0 ? argv[0] : nullptr);
  log.info("nri.started", {{"hook_binary", hook_binary}});
  CgroupMountPoints cgroup_mounts;  // read again only after the host's mount table changed
  ShimContext ctx{*config, log, host_nvml_inventory(config->nvml_library), hook_binary,
                  CdiEdits::already_injected};
  ctx.cgroup_mounts = &cgroup_mounts;
  const char* launched_fd = std::getenv("NRI_PLUGIN_SOCKET");
  gnri::GpufenceHandler handler(
      ctx, launched_fd ? cat("launched by containerd (fd ", launched_fd, ")") : socket_path);

  // Launched by containerd: fd 3, name and index from the environment (nri@v0.12.0:
  // pkg/adaptation/plugin.go newLaunchedPlugin); the connection is the plugin's life.
  if (const char* fd_text = launched_fd) {
    if (const char* n = std::getenv("NRI_PLUGIN_NAME")) options.name = n;
    if (const char* i = std::getenv("NRI_PLUGIN_IDX")) options.index = i;
    int fd = std::atoi(fd_text);
    if (fd < 3) {
      log.error("nri.bad_socket_fd", {{"NRI_PLUGIN_SOCKET", fd_text}});
      return 1;
    }
    auto st = gnri::run_session(fd, options, handler, log);
    if (!st) log.error("nri.session_failed", {{"error", st.error().message}});
    handler.disconnected(gnri::NriState::exited);
    return st ? 0 : 1;
  }

  // External: connect, serve, and reconnect when containerd goes away (it never reconnects a
  // plugin itself, docs/nri.md).
  bool announced_wait = false;
  handler.disconnected(gnri::NriState::waiting);
  for (;;) {
    auto fd = gnri::connect_nri_socket(socket_path);
    if (!fd) {
      if (!announced_wait)
        log.warn("nri.waiting_for_runtime",
                 {{"socket", socket_path}, {"error", fd.error().message}});
      announced_wait = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    announced_wait = false;
    log.info("nri.connected", {{"socket", socket_path}});
    auto st = gnri::run_session(*fd, options, handler, log);
    ::close(*fd);
    handler.disconnected(gnri::NriState::waiting);
    if (!st)
      log.error("nri.session_failed", {{"error", st.error().message}});
    else
      log.info("nri.disconnected", {{"socket", socket_path}});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
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
