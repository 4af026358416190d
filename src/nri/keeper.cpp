#include "nri/keeper.hpp"
#include "common/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "nri/status.hpp"

namespace gpufence::nri {

std::string_view role_name(Role role) {
  return role == Role::fence ? "fence" : "decider";
}

std::string KeeperFiles::serving(Role role) const {
  return cat(dir, "/", role_name(role), ".lock");
}

std::string KeeperFiles::keeper(Role role) const {
  return cat(dir, "/", role_name(role), "-keeper.lock");
}

Result<std::optional<Fd>> take_lock(const std::string& path, LockWait wait,
                                    std::chrono::milliseconds timeout) {
  auto fd = open_append_checked(path, Symlinks::none, 0600, MakeDir::yes);
  if (!fd) return std::unexpected(fd.error());
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (::flock(fd->fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR) return fail_errno("flock", path);
    if (wait == LockWait::no || std::chrono::steady_clock::now() >= until)
      return std::optional<Fd>();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The holder, for the keeper's stopped-process check and ensure_keeper's binary check (the file
  // is ours: O_APPEND, so truncate first).
  uint64_t start = 0;
  if (auto stat = read_file("/proc/self/stat"))
    if (auto t = parse_proc_start_time(*stat)) start = *t;
  std::string holder = cat(::getpid(), " ", start, "\n");
  if (::ftruncate(fd->fd, 0) != 0 || ::write(fd->fd, holder.data(), holder.size()) < 0)
    return fail_errno("write", path);
  return std::optional<Fd>(std::move(*fd));
}

std::optional<LockHolder> lock_holder(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0) return std::nullopt;
  if (::flock(fd.fd, LOCK_SH | LOCK_NB) == 0) return std::nullopt;  // nobody holds it
  auto text = read_fd(fd.fd, path, 64);
  if (!text) return std::nullopt;
  LockHolder h;
  unsigned long long start = 0;
  long pid = 0;
  if (std::sscanf(text->c_str(), "%ld %llu", &pid, &start) != 2 || pid <= 1) return std::nullopt;
  h.pid = static_cast<pid_t>(pid);
  h.start_time = start;
  return h;
}

namespace {

// /proc/<pid>/stat when it is still the holder's process.
std::optional<std::string> holder_stat(const LockHolder& holder) {
  auto text = read_file(cat("/proc/", holder.pid, "/stat"));
  if (!text) return std::nullopt;
  auto start = parse_proc_start_time(*text);
  if (!start || *start != holder.start_time) return std::nullopt;
  return std::move(*text);
}

}  // namespace

bool process_stopped(const LockHolder& holder) {
  auto text = holder_stat(holder);
  if (!text) return false;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
  auto close = text->rfind(')');
  if (close == std::string::npos || close + 2 >= text->size()) return false;
  char state = (*text)[close + 2];
  return state == 'T' || state == 't';
}

std::string holder_executable(const LockHolder& holder) {
  char buf[4096];
  ssize_t n = ::readlink(cat("/proc/", holder.pid, "/exe").c_str(), buf, sizeof buf - 1);
  if (n <= 0 || !holder_stat(holder)) return "";
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

std::vector<std::string> role_args(Role role) {
  if (role == Role::fence) return {"--fence"};
  return {};
}

// fork + exec of self with `args`, environment reduced to what the plugin reads; `detach`: in a
// session of its own, reparented to init (double fork), so neither containerd's SIGKILL of the
// launched plugin nor its exit takes it along.
pid_t spawn(const std::string& self_exe, const std::vector<std::string>& args, bool detach,
            const std::string& config_path = "") {
  std::vector<std::string> argv_s{self_exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s{
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  if (!config_path.empty())
    env_s.push_back(cat("GPUFENCE_RUNTIME_CONFIG=", config_path));
  else if (const char* c = std::getenv("GPUFENCE_RUNTIME_CONFIG"))
    env_s.push_back(cat("GPUFENCE_RUNTIME_CONFIG=", c));
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) {
    if (pid > 0 && detach) ::waitpid(pid, nullptr, 0);  // the middle child exits at once
    return pid;
  }
  // Child: only 0-2 stay open (containerd's fd 3 and any lock are not the keeper's).
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (detach) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      if (null > 2) ::close(null);
    }
  }
  ::execve(self_exe.c_str(), argv.data(), envp.data());
  ::_exit(127);
}

bool binary_replaced(const std::string& self_exe) {
  std::string now = self_executable();
  if (now.empty()) return true;
  return now.ends_with(" (deleted)") || now != self_exe;
}

}  // namespace

void ensure_keeper(const KeeperFiles& files, Role role, const std::string& self_exe,
                   const std::string& socket, const std::string& config_path, Logger& log) {
  if (files.dir.empty()) return;
  auto held = take_lock(files.keeper(role), LockWait::no);
  if (!held) {
    log.warn("nri.keeper_unavailable", {{"error", held.error().message}});
    return;
  }
  if (!*held) {
    // A keeper runs. One of another binary (an upgrade keeps the file it replaced, so that keeper
    // never sees its own file go) is ended, and this binary's started instead.
    auto holder = lock_holder(files.keeper(role));
    if (!holder) return;
    std::string exe = holder_executable(*holder);
    if (exe.empty() || exe == self_exe) return;
    log.info("nri.keeper_replaced", {{"role", std::string(role_name(role))}, {"old", exe}});
    ::kill(holder->pid, SIGTERM);
  } else {
    held->reset();  // released: the keeper takes it itself
  }
  std::vector<std::string> args{"--keeper", "--socket", socket};
  for (auto& a : role_args(role)) args.push_back(a);
  if (spawn(self_exe, args, true, config_path) < 0)
    log.warn("nri.keeper_unavailable", {{"error", "fork failed"}});
  else
    log.info("nri.keeper_started", {{"role", std::string(role_name(role))}});
}

int run_keeper(const KeeperFiles& files, Role role, const std::string& self_exe,
               const std::string& socket, Logger& log) {
  // A keeper being replaced may still be exiting.
  auto held = take_lock(files.keeper(role), LockWait::yes, std::chrono::milliseconds(3000));
  if (!held) {
    log.error("nri.keeper_failed", {{"error", held.error().message}});
    return 1;
  }
  if (!*held) return 0;  // another keeper won the race
  const std::string role_text(role_name(role));
  log.info("nri.keeper",
           {{"role", role_text}, {"socket", socket}, {"pid", std::to_string(::getpid())}});
  using Clock = std::chrono::steady_clock;
  pid_t child = -1;
  Clock::time_point last_spawn{}, last_served = Clock::now();
  Clock::time_point stopped_since{};  // epoch: the holder is not stopped
  LockHolder stopped_holder;
  std::vector<std::string> args{"--once", "--socket", socket};
  for (auto& a : role_args(role)) args.push_back(a);
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (binary_replaced(self_exe)) {
      log.info("nri.keeper_exit", {{"role", role_text}, {"why", "its binary was replaced"}});
      return 0;
    }
    if (child > 0 && ::waitpid(child, nullptr, WNOHANG) == child) child = -1;
    auto holder = lock_holder(files.serving(role));
    const auto now = Clock::now();
    if (holder) {
      last_served = now;
      // A server that cannot answer (stopped) is as gone as a dead one, but holds the lock.
      if (process_stopped(*holder)) {
        if (stopped_since == Clock::time_point{} || !(stopped_holder == *holder)) {
          stopped_since = now;
          stopped_holder = *holder;
        }
        if (now - stopped_since > kStoppedGrace) {
          log.warn("nri.keeper_kills_stopped",
                   {{"role", role_text}, {"pid", std::to_string(holder->pid)}});
          if (process_stopped(*holder)) ::kill(holder->pid, SIGKILL);  // still that process
          stopped_since = {};
        }
      } else {
        stopped_since = {};
      }
      continue;
    }
    stopped_since = {};
    if (now - last_served > kIdleExit) {
      log.info("nri.keeper_exit",
               {{"role", role_text}, {"why", "containerd's NRI socket stayed away"}});
      return 0;
    }
    if (child > 0 || now - last_spawn < kRespawnEvery) continue;
    last_spawn = now;
    child = spawn(self_exe, args, false);
    if (child > 0)
      log.info("nri.keeper_respawn", {{"role", role_text}, {"pid", std::to_string(child)}});
  }
}

}  // namespace gpufence::nri
