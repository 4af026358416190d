// The hooks gpufence-runtime runs as host root in a container's mount namespace
// (runtime/hooks.hpp): each test attacks one of their promises. ldconfig runs with the fixed hook
// environment, by absolute path, with `-r ROOT`, under a time limit, with the root's /proc and
// /sys covered; every path is resolved inside the container's root, so an image's symlinks never
// lead a write or a mount onto the host; the driver-procfs hook fails closed, update-ldcache
// never stops a container.
//
// Mounting tests run in a forked child with a private mount namespace, so nothing they mount
// reaches this machine; where namespaces cannot be made (no CAP_SYS_ADMIN) they skip, saying why.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>

#include "cdi/hook_defaults.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "runtime/hooks.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
namespace fs = std::filesystem;

namespace {

constexpr const char* kGpuA = "0000:01:00.0";
constexpr const char* kGpuB = "0000:02:00.0";
constexpr const char* kSkipPrefix = "SKIP: ";

// Runs `body` in a forked child in a private mount namespace and returns what it printed to the
// pipe. "SKIP: why" when the namespace cannot be made.
std::string in_private_mount_namespace(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      out = cat(kSkipPrefix, "cannot make a private mount namespace: ", std::strerror(errno));
    else
      out = body();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

// Whether update_ldcache could not make ldconfig's private mount namespace here (no
// CAP_SYS_ADMIN): it then refuses to run ldconfig at all, and the test has nothing to observe.
bool unconfined(const Status& st) {
  return !st && st.error().message.find("cannot confine") != std::string::npos;
}

// Entry names of a directory ("ERR <errno>" when it cannot be listed), as the child sees it.
std::string listing(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  if (ec) return cat("ERR ", ec.message());
  std::sort(names.begin(), names.end());
  return join(names, ",");
}

// Whether a file can be created in `dir` (by the host's root, as the hook runs).
bool can_create_in(const fs::path& dir) {
  int fd = ::open((dir / "planted").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// A rootfs with the driver's per-GPU directory for two GPUs at `at` (relative to the root).
void driver_dir(const test::TempDir& dir, const std::string& at) {
  for (const char* gpu : {kGpuA, kGpuB})
    dir.write(cat(at, "/", gpu, "/information"), cat("Bus Location: ", gpu, "\n"));
}

// An executable script standing in for ldconfig.
std::string fake_ldconfig(const test::TempDir& dir, const std::string& body) {
  fs::path p = dir.write("bin/fake-ldconfig", "#!/bin/sh\n" + body);
  fs::permissions(p, fs::perms::owner_all);
  return p.string();
}

// Sets an environment variable for one scope (the image's env as this process would pass it on).
class ScopedEnv {
 public:
  ScopedEnv(const char* key, const std::string& value) : m_key(key) {
    if (const char* old = std::getenv(key)) m_old = old;
    ::setenv(key, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (m_old)
      ::setenv(m_key, m_old->c_str(), 1);
    else
      ::unsetenv(m_key);
  }

 private:
  const char* m_key;
  std::optional<std::string> m_old;
};

// The container's state on stdin, as runc hands it to a hook.
class ScopedStdin {
 public:
  explicit ScopedStdin(const std::string& text) : m_in(text), m_old(std::cin.rdbuf(m_in.rdbuf())) {}
  ~ScopedStdin() { std::cin.rdbuf(m_old); }

 private:
  std::istringstream m_in;
  std::streambuf* m_old;
};

std::string state_for(const fs::path& bundle) {
  return cat(R"({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "bundle": ")",
             bundle.string(), R"("})");
}

}  // namespace

// --- the container's root from its state -----------------------------------------------------

TEST(HookState, TheRootIsTheBundlesRootPathMadeAbsolute) {
  test::TempDir dir;
  dir.write("bundle/config.json", R"({"root": {"path": "rootfs"}})");
  auto c = container_from_state(state_for(dir / "bundle"));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->rootfs, dir / "bundle/rootfs");
  EXPECT_EQ(c->cgroupns, CgroupNamespace::host);
  dir.write("bundle/config.json", R"({"root": {"path": "/somewhere/else"}})");
  c = container_from_state(state_for(dir / "bundle"));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->rootfs, fs::path("/somewhere/else"));
}

TEST(HookState, ARelativeOrMissingBundleOrRootIsRefused) {
  test::TempDir dir;
  dir.write("bundle/config.json", R"({"root": {"path": "rootfs"}})");
  // The hook's cwd is the container's rootfs: a relative bundle would be read from the image.
  EXPECT_FALSE(container_from_state(R"({"bundle": "bundle"})"));
  EXPECT_FALSE(container_from_state(R"({"bundle": ""})"));
  EXPECT_FALSE(container_from_state(R"({"id": "c1"})"));
  EXPECT_FALSE(container_from_state(R"({"bundle": 7})"));
  EXPECT_FALSE(container_from_state("not json"));
  dir.write("bundle/config.json", R"({"process": {}})");
  auto c = container_from_state(state_for(dir / "bundle"));
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("root.path"), std::string::npos) << c.error().message;
}

// --- update-ldcache -----------------------------------------------------------------------------

TEST(HookLdcache, LibraryFoldersMustBeAbsolutePathsOnOneLine) {
  test::TempDir dir;
  fs::create_directories(dir / "rootfs");
  std::string ldconfig = fake_ldconfig(dir, "exit 0\n");
  for (const std::string& bad : {std::string("usr/lib/nvidia"), std::string(""),
                                 std::string("/usr/lib\n/tmp/evil"), std::string("./lib")}) {
    auto st = update_ldcache(dir / "rootfs", {"/usr/lib/x86_64-linux-gnu", bad}, ldconfig);
    ASSERT_FALSE(st) << "'" << bad << "' accepted";
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
  }
  EXPECT_FALSE(fs::exists(dir / "rootfs/etc")) << "nothing written before the folders are checked";
}

TEST(HookLdcache, LdconfigIsTheHostsByAbsolutePathNeverFromPath) {
  test::TempDir dir;
  fs::create_directories(dir / "rootfs");
  // A directory first on PATH with an ldconfig that leaves a mark: neither a relative override
  // nor the default lookup may run it.
  fs::path mark = dir / "ran-from-path";
  dir.write("path/ldconfig", cat("#!/bin/sh\ntouch ", mark.string(), "\n"));
  fs::permissions(dir / "path/ldconfig", fs::perms::owner_all);
  ScopedEnv path("PATH", cat((dir / "path").string(), ":", std::getenv("PATH")));
  auto st = update_ldcache(dir / "rootfs", {"/usr/lib/x86_64-linux-gnu"}, "ldconfig");
  ASSERT_FALSE(st) << "a relative ldconfig was accepted";
  EXPECT_FALSE(fs::exists(mark));
  (void)update_ldcache(dir / "rootfs", {"/usr/lib/x86_64-linux-gnu"});  // /sbin or /usr/sbin
  EXPECT_FALSE(fs::exists(mark)) << "the default ldconfig was looked up on PATH";
}

TEST(HookLdcache, LdconfigGetsTheFixedEnvironmentAndDashRTheRoot) {
  test::TempDir dir;
  fs::create_directories(dir / "rootfs");
  // What the hook's own process carries (runc runs a hook without `env` with the container's).
  ScopedEnv leak("GPUFENCE_IMAGE_VARIABLE", "from-the-image");
  ScopedEnv preload("LD_LIBRARY_PATH", "/image/lib");
  std::string ldconfig = fake_ldconfig(dir, "/usr/bin/env\necho \"argv: $*\"\nexit 3\n");
  auto st = update_ldcache(dir / "rootfs", {"/usr/lib/x86_64-linux-gnu"}, ldconfig);
  ASSERT_FALSE(st) << "the fake ldconfig exits 3";
  if (unconfined(st)) GTEST_SKIP() << st.error().message;
  const std::string& msg = st.error().message;
  EXPECT_NE(msg.find(cat("argv: -r ", (dir / "rootfs").string())), std::string::npos) << msg;
  EXPECT_EQ(msg.find("GPUFENCE_IMAGE_VARIABLE"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("LD_LIBRARY_PATH"), std::string::npos) << msg;
  // The whole environment, one VAR=value a line after "failed: "; dash adds the PWD it computes.
  std::vector<std::string> env;
  std::string_view out = std::string_view(msg).substr(msg.find("failed: ") + 8);
  for (std::string_view line : split(out, '\n'))
    if (!line.starts_with("argv:") && !line.starts_with("PWD=") && !line.empty())
      env.emplace_back(line);
  EXPECT_EQ(env, kMinimalHookEnv) << msg;
}

TEST(HookLdcache, AStuckLdconfigIsKilledAtItsTimeLimit) {
  test::TempDir dir;
  fs::create_directories(dir / "rootfs");
  std::string ldconfig = fake_ldconfig(dir, "exec /bin/sleep 60\n");
  auto start = std::chrono::steady_clock::now();
  auto st = update_ldcache(dir / "rootfs", {"/usr/lib/x86_64-linux-gnu"}, ldconfig,
                           std::chrono::milliseconds(300));
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(st);
  if (unconfined(st)) GTEST_SKIP() << st.error().message;
  EXPECT_NE(st.error().message.find("timed out"), std::string::npos) << st.error().message;
  EXPECT_LT(took, std::chrono::seconds(5));
  // The hook must answer before runc's own limit on it kills the hook and fails the create.
  EXPECT_LT(kLdconfigTimeout, std::chrono::seconds(kDefaultHookTimeoutSeconds));
}

TEST(HookLdcache, TheRootsProcAndSysAreCoveredForLdconfigOnly) {
  test::TempDir dir;
  // At createContainer time the root has procfs mounted: /proc/1/root leads to the host. Here
  // plain directories stand in for them; a link to one elsewhere in the root is followed inside.
  dir.write("rootfs/proc/1/root-of-the-host", "x");
  dir.write("rootfs/elsewhere/secret", "x");
  fs::create_symlink("/elsewhere", dir / "rootfs/sys");
  std::string root = (dir / "rootfs").string();
  std::string ldconfig = fake_ldconfig(
      dir, "echo \"proc:$(ls -A \"$2/proc\") sys:$(ls -A \"$2/elsewhere\")\"\nexit 3\n");
  auto st = update_ldcache(dir / "rootfs", {"/usr/lib/x86_64-linux-gnu"}, ldconfig);
  ASSERT_FALSE(st);
  if (unconfined(st)) GTEST_SKIP() << st.error().message;
  EXPECT_NE(st.error().message.find("proc: sys:"), std::string::npos) << st.error().message;
  // Covered in ldconfig's own namespace only: the container (and this host) still see them.
  EXPECT_TRUE(fs::exists(dir / "rootfs/proc/1/root-of-the-host"));
  EXPECT_TRUE(fs::exists(dir / "rootfs/elsewhere/secret"));
}

TEST(HookLdcache, TheConfFileIsWrittenInsideTheRootThroughTheImagesLinks) {
  test::TempDir dir;
  fs::path host_etc = dir / "host-etc";  // stands for the host's /etc
  fs::create_directories(host_etc / "ld.so.conf.d");
  dir.write("host-etc/ld.so.conf.d/00-gpufence-cdi.conf", "the host's\n");
  dir.write("host-file", "the host's\n");
  // The image's /etc is an absolute link to the host's path; inside the root that path is a
  // directory of the image, and that is where the file must land.
  fs::create_directories(dir / "rootfs" / host_etc.relative_path());
  fs::create_symlink(host_etc, dir / "rootfs/etc");
  std::string ldconfig = fake_ldconfig(dir, "exit 0\n");
  auto st = update_ldcache(dir / "rootfs", {"/usr/lib/a", "/usr/lib/b"}, ldconfig);
  if (unconfined(st)) GTEST_SKIP() << st.error().message;
  ASSERT_TRUE(st) << st.error().message;
  fs::path inside = dir / "rootfs" / host_etc.relative_path() / "ld.so.conf.d";
  EXPECT_EQ(read_file(inside / "00-gpufence-cdi.conf").value_or("?"), "/usr/lib/a\n/usr/lib/b\n");
  EXPECT_EQ(read_file(host_etc / "ld.so.conf.d/00-gpufence-cdi.conf").value_or("?"),
            "the host's\n");
  EXPECT_EQ(listing(inside), "00-gpufence-cdi.conf") << "no temporary file left behind";

  // The file itself a link out of the root: replaced, never written through.
  fs::remove(inside / "00-gpufence-cdi.conf");
  fs::create_symlink(dir / "host-file", inside / "00-gpufence-cdi.conf");
  st = update_ldcache(dir / "rootfs", {"/usr/lib/c"}, ldconfig);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(read_file(dir / "host-file").value_or("?"), "the host's\n");
  EXPECT_FALSE(fs::is_symlink(inside / "00-gpufence-cdi.conf"));
  EXPECT_EQ(read_file(inside / "00-gpufence-cdi.conf").value_or("?"), "/usr/lib/c\n");
}

// --- driver-procfs ------------------------------------------------------------------------------

TEST(HookDriverProcfs, OnlyTheKeptEntriesRemainAndTheDirectoryIsReadOnly) {
  test::TempDir dir;
  driver_dir(dir, "rootfs/proc/driver/nvidia/gpus");
  fs::path gpus = dir / "rootfs/proc/driver/nvidia/gpus";
  std::string out = in_private_mount_namespace([&] {
    auto st = narrow_directory(dir / "rootfs", "/proc/driver/nvidia/gpus", {kGpuB});
    if (!st) return "narrow: " + st.error().message;
    return cat(listing(gpus), " info:", read_file(gpus / kGpuB / "information").value_or("?"),
               " writable:", can_create_in(gpus) ? "yes" : "no");
  });
  if (out.starts_with(kSkipPrefix)) GTEST_SKIP() << out;
  EXPECT_EQ(out, cat(kGpuB, " info:Bus Location: ", kGpuB, "\n writable:no"));
  EXPECT_EQ(listing(gpus), cat(kGpuA, ",", kGpuB)) << "the mounts stayed in the child";
}

TEST(HookDriverProcfs, TheDirectoryIsResolvedInsideTheRoot) {
  test::TempDir dir;
  // The image's /proc links to an absolute path that exists on the host too: the host's copy
  // must stay as it is, the image's (that path inside the root) is narrowed.
  fs::path host_side = dir / "host-proc";
  driver_dir(dir, "host-proc/driver/nvidia/gpus");
  driver_dir(dir, cat("rootfs", host_side.string(), "/driver/nvidia/gpus"));
  fs::create_symlink(host_side, dir / "rootfs/proc");
  fs::path inside = dir / "rootfs" / host_side.relative_path() / "driver/nvidia/gpus";
  std::string out = in_private_mount_namespace([&] {
    auto st = narrow_directory(dir / "rootfs", "proc/driver/nvidia/gpus", {kGpuA});
    if (!st) return "narrow: " + st.error().message;
    return cat("host:", listing(host_side / "driver/nvidia/gpus"), " root:", listing(inside));
  });
  if (out.starts_with(kSkipPrefix)) GTEST_SKIP() << out;
  EXPECT_EQ(out, cat("host:", kGpuA, ",", kGpuB, " root:", kGpuA));
}

TEST(HookDriverProcfs, AKeptEntryThatIsALinkFailsClosed) {
  test::TempDir dir;
  driver_dir(dir, "rootfs/proc/driver/nvidia/gpus");
  fs::path gpus = dir / "rootfs/proc/driver/nvidia/gpus";
  fs::remove_all(gpus / kGpuA);
  fs::create_symlink(dir / "host-secret", gpus / kGpuA);  // bound back, it would show the host's
  dir.write("host-secret/information", "x");
  auto st = narrow_directory(dir / "rootfs", "/proc/driver/nvidia/gpus", {kGpuA});
  EXPECT_FALSE(st) << "a link was accepted as a kept entry";
}

TEST(HookDriverProcfs, EntryNamesCannotLeaveTheDirectory) {
  test::TempDir dir;
  driver_dir(dir, "rootfs/proc/driver/nvidia/gpus");
  for (const std::string& bad : {std::string(".."), std::string("."), std::string(""),
                                 std::string("../../../etc"), std::string("a/b")}) {
    auto st = narrow_directory(dir / "rootfs", "/proc/driver/nvidia/gpus", {kGpuA, bad});
    ASSERT_FALSE(st) << "'" << bad << "' accepted";
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
  }
}

TEST(HookDriverProcfs, NoDriverDirectoryInTheContainerIsNotAnError) {
  test::TempDir dir;
  fs::create_directories(dir / "rootfs/proc");
  EXPECT_TRUE(narrow_directory(dir / "rootfs", "/proc/driver/nvidia/gpus", {kGpuA}));
}

// --- `gpufence-runtime hook NAME ...` -----------------------------------------------------------

TEST(HookCommand, UsageErrorsAreExitTwo) {
  test::TempDir dir;
  fs::create_directories(dir / "bundle/rootfs");
  dir.write("bundle/config.json", R"({"root": {"path": "rootfs"}})");
  auto run = [&](std::vector<std::string> args) {
    ScopedStdin in(state_for(dir / "bundle"));
    return run_hook(args);
  };
  EXPECT_EQ(run({}), 2);
  EXPECT_EQ(run({"no-such-hook"}), 2);
  EXPECT_EQ(run({"cgroup-mounts", "--dir", "/x"}), 2);
  EXPECT_EQ(run({"driver-procfs", "--dir"}), 2);
  EXPECT_EQ(run({"driver-procfs", "--bogus", "x"}), 2);
}

TEST(HookCommand, ABadStateStopsTheIsolationHooks) {
  for (const char* hook : {"cgroup-mounts", "driver-procfs"}) {
    ScopedStdin in(R"({"bundle": "relative"})");
    EXPECT_EQ(run_hook({hook}), 1) << hook;
  }
}

TEST(HookCommand, DriverProcfsFailsClosedAndUpdateLdcacheNeverStopsTheContainer) {
  test::TempDir dir;
  driver_dir(dir, "bundle/rootfs/proc/driver/nvidia/gpus");
  dir.write("bundle/config.json", R"({"root": {"path": "rootfs"}})");
  {
    // Isolation: a refusal to narrow stops the container rather than showing it every GPU.
    ScopedStdin in(state_for(dir / "bundle"));
    EXPECT_EQ(run_hook({"driver-procfs", "--dir", "/proc/driver/nvidia/gpus", "--keep", ".."}), 1);
  }
  {
    // Convenience: a folder it refuses is a warning, the container starts.
    ScopedStdin in(state_for(dir / "bundle"));
    EXPECT_EQ(run_hook({"update-ldcache", "--folder", "relative/lib"}), 0);
  }
}
