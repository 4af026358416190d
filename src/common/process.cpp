#include "common/process.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <cstdlib>
#include <filesystem>

#include "common/file.hpp"

extern char** environ;

namespace gpufence {

ProcessResult wait_for_exit(pid_t pid, std::chrono::milliseconds timeout) {
  ProcessResult result;
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, timeout.count() > 0 ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (timeout.count() > 0 && std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      result.timed_out = true;
      break;
    }
    if (timeout.count() > 0) ::usleep(2000);
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

Result<pid_t> spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) return fail(Errc::invalid_argument, "spawn: empty command");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env_ptrs;
  if (options.env) {
    for (const auto& e : *options.env) env_ptrs.push_back(const_cast<char*>(e.c_str()));
    env_ptrs.push_back(nullptr);
  }
  char** envp = options.env ? env_ptrs.data() : environ;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears close-on-exec on the copy only, so the caller's descriptors may carry it.
  if (options.stdin_fd >= 0)
    posix_spawn_file_actions_adddup2(&actions, options.stdin_fd, 0);
  else
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (options.stdout_fd >= 0) posix_spawn_file_actions_adddup2(&actions, options.stdout_fd, 1);
  if (options.stderr_fd >= 0) posix_spawn_file_actions_adddup2(&actions, options.stderr_fd, 2);
  // Nothing else of ours, inherited or not marked close-on-exec, reaches the child (glibc 2.34).
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  bool search = argv[0].find('/') == std::string::npos;
  int rc = search ? ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), envp)
                  : ::posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return fail_errno("run", argv[0], rc);
  return pid;
}

Result<ProcessResult> run_process(const std::vector<std::string>& argv,
                                  const ProcessOptions& options) {
  if (argv.empty()) return fail(Errc::invalid_argument, "run_process: empty command");
  char tmpl[] = "/tmp/gpufence-proc-XXXXXX";
  int out_fd = ::mkostemp(tmpl, O_CLOEXEC);
  if (out_fd < 0) return fail_errno("mkostemp", tmpl);
  ::unlink(tmpl);
  auto pid = spawn_process(argv, {.env = options.env, .stdout_fd = out_fd, .stderr_fd = out_fd});
  if (!pid) {
    ::close(out_fd);
    return std::unexpected(pid.error());
  }
  ProcessResult result = wait_for_exit(*pid, options.timeout);
  ::lseek(out_fd, 0, SEEK_SET);
  char buf[8192];
  ssize_t n;
  while ((n = ::read(out_fd, buf, sizeof buf)) > 0) result.out.append(buf, static_cast<size_t>(n));
  ::close(out_fd);
  return result;
}

Result<std::string> unified_diff(const std::string& old_text, const std::string& new_text,
                                 const std::string& old_label, const std::string& new_label) {
  if (old_text == new_text) return std::string();
  char dir_tmpl[] = "/tmp/gpufence-diff-XXXXXX";
  if (!::mkdtemp(dir_tmpl)) return fail_errno("mkdtemp", dir_tmpl);
  std::filesystem::path dir = dir_tmpl;
  auto cleanup = [&] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  };
  if (auto st = write_file_atomic(dir / "old", old_text, Durability::none); !st) {
    cleanup();
    return std::unexpected(st.error());
  }
  if (auto st = write_file_atomic(dir / "new", new_text, Durability::none); !st) {
    cleanup();
    return std::unexpected(st.error());
  }
  auto r = run_process({"diff", "-u", "--label", old_label, "--label", new_label,
                        (dir / "old").string(), (dir / "new").string()});
  cleanup();
  if (!r) return std::unexpected(r.error());
  if (r->exit_code > 1) return fail(Errc::io, "diff failed: ", r->out);
  return r->out;
}

std::string self_executable() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
}

std::string beside_self(std::string_view name) {
  std::string self = self_executable();
  if (self.empty() || self.ends_with(" (deleted)")) return std::string(name);
  return (std::filesystem::path(self).parent_path() / name).string();
}

}  // namespace gpufence
