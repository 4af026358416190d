// What the cgroup-mounts hook judges: the container's own mount table after runc made every
// mount (literal mountinfo text as runc 1.1.5 leaves it on cgroup v1 and v2), not a path read
// before. The cases are the ways a cgroup filesystem reaches a container besides the runtime's.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <variant>

#include "common/strings.hpp"
#include "runtime/hooks.hpp"
#include "runtime/mount_guard.hpp"
#include "runtime/mount_table.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

constexpr const char* kRoot = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs";

// runc 1.1.5 on cgroup v1, containerd's default /sys/fs/cgroup mount (read-only), no cgroupns:
// a tmpfs with each hierarchy bound from the container's own cgroup (seen on this project's CI).
std::string runc_v1_table(const std::string& extra = "") {
  std::string r = kRoot;
  return cat(
      "60 59 0:50 / ", r, " rw,relatime - overlay overlay rw\n", "61 60 0:51 / ", r,
      "/proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n", "73 72 0:44 / ", r,
      "/sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw\n",
      "74 73 0:29 /kubepods/podX/ctr1 ", r,
      "/sys/fs/cgroup/cpu ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu\n",
      "78 73 0:33 /kubepods/podX/ctr1 ", r,
      "/sys/fs/cgroup/devices ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,devices\n",
      "82 73 0:37 /kubepods/podX/ctr1 ", r,
      "/sys/fs/cgroup/systemd ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,name=systemd\n",
      "90 60 8:1 /data/vol ", r, "/data rw,relatime - ext4 /dev/vda1 rw\n", extra);
}

Status judge(const std::string& table, CgroupNamespace ns = CgroupNamespace::host) {
  return check_container_cgroup_mounts(table, kRoot, ns);
}

}  // namespace

TEST(ContainerCgroupMounts, TheRuntimesOwnReadOnlyMountsPass) {
  auto st = judge(runc_v1_table());
  EXPECT_TRUE(st) << st.error().message;
  // cgroup v2 with a cgroup namespace: one cgroup2 mount, rooted at the namespace's root.
  std::string v2 = cat("73 72 0:44 / ", kRoot,
                       "/sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n");
  st = judge(v2, CgroupNamespace::own);
  EXPECT_TRUE(st) << st.error().message;
}

// The race of the issue: a hostPath source swapped for a link to /sys/fs/cgroup after the path
// check; runc then bound the host's hierarchies (rbind) at the volume's destination.
TEST(ContainerCgroupMounts, AHostCgroupfsAtAVolumesDestinationIsRefused) {
  std::string r = kRoot;
  auto st = judge(runc_v1_table(
      cat("93 60 0:28 / ", r, "/data ro,relatime - tmpfs tmpfs rw,mode=755\n", "94 93 0:33 / ", r,
          "/data/devices rw,relatime - cgroup cgroup rw,devices\n")));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("a cgroup filesystem mounted at /data/devices"),
            std::string::npos)
      << st.error().message;
}

TEST(ContainerCgroupMounts, ReadOnlyDoesNotMakeAForeignPlaceAcceptable) {
  std::string r = kRoot;
  auto st = judge(runc_v1_table(
      cat("94 60 0:33 / ", r, "/host-devices ro,relatime - cgroup cgroup rw,devices\n")));
  EXPECT_FALSE(st);
}

// A volume whose destination resolves (through an image symlink) onto the runtime's own place.
TEST(ContainerCgroupMounts, AHierarchyRootOverTheOwnPlaceIsRefused) {
  std::string r = kRoot;
  auto st = judge(runc_v1_table(
      cat("95 78 0:33 / ", r, "/sys/fs/cgroup/devices ro,relatime - cgroup cgroup rw,devices\n")));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("hierarchy's / at /sys/fs/cgroup/devices"), std::string::npos)
      << st.error().message;
  // Writable, even when rooted at the container's own cgroup: it could write cgroup.procs.
  st = judge(runc_v1_table(cat("95 78 0:33 /kubepods/podX/ctr1 ", r,
                               "/sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n")));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("writable"), std::string::npos) << st.error().message;
  // Above a cgroup namespace's root (the kernel shows "/.."), even at the own place.
  st = judge(
      cat("73 72 0:44 /../../.. ", kRoot, "/sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw\n"),
      CgroupNamespace::own);
  EXPECT_FALSE(st);
}

TEST(ContainerCgroupMounts, DeeperThanOneHierarchyBelowTheOwnPlaceIsRefused) {
  std::string r = kRoot;
  auto st = judge(runc_v1_table(cat("96 78 0:33 /kubepods/podX/ctr1 ", r,
                                    "/sys/fs/cgroup/devices/x ro,relatime - cgroup cgroup rw\n")));
  EXPECT_FALSE(st);
}

TEST(ContainerCgroupMounts, OtherContainersAndTheHostAreNotJudged) {
  // Mount points outside this container's root (the hook reads its namespace's whole table).
  auto st =
      judge(runc_v1_table("30 1 0:33 / /sys/fs/cgroup/devices rw - cgroup cgroup rw\n"
                          "31 1 0:33 / /run/containerd/other/rootfs/x rw - cgroup cgroup rw\n"));
  EXPECT_TRUE(st) << st.error().message;
  // A sibling directory whose name starts like the root is outside it.
  st = judge(runc_v1_table(cat("32 1 0:33 / ", kRoot, "2/x rw - cgroup cgroup rw\n")));
  EXPECT_TRUE(st) << st.error().message;
}

TEST(ContainerCgroupMounts, EscapedMountPointsAreRead) {
  std::string r = kRoot;
  auto st = judge(
      runc_v1_table(cat("97 60 0:33 / ", r, "/a\\040b ro,relatime - cgroup cgroup rw,devices\n")));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("/a b"), std::string::npos) << st.error().message;
}

TEST(ContainerCgroupMounts, TheHookReadsItsMountTableAndTheBundle) {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "bundle/rootfs");
  dir.write("bundle/config.json",
            R"({"root": {"path": "rootfs"}, "linux": {"namespaces": [{"type": "cgroup"}]}})");
  auto c = container_from_state(cat(R"({"bundle": ")", (dir / "bundle").string(), R"("})"));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->cgroupns, CgroupNamespace::own);
  std::string root = std::filesystem::canonical(dir / "bundle/rootfs").string();
  dir.write("mountinfo", cat("94 60 0:33 / ", root, "/x ro - cgroup cgroup rw,devices\n"));
  EXPECT_FALSE(check_cgroup_mounts(*c, (dir / "mountinfo").string()));
  dir.write("mountinfo", cat("94 60 0:33 / ", root, "/sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"));
  EXPECT_TRUE(check_cgroup_mounts(*c, (dir / "mountinfo").string()));
  EXPECT_FALSE(check_cgroup_mounts(*c, (dir / "no-such-file").string())) << "fails closed";
}

TEST(ContainerCgroupMounts, OnlySpecsWithABindOrAForeignCgroupMountNeedTheHook) {
  auto spec = [](const char* mounts) { return Json::parse(cat(R"({"mounts": )", mounts, "}")); };
  EXPECT_FALSE(may_mount_a_cgroupfs(spec(R"([{"destination": "/proc", "type": "proc"},
      {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"}])")));
  EXPECT_TRUE(may_mount_a_cgroupfs(
      spec(R"([{"destination": "/d", "type": "bind", "source": "/data", "options": ["rbind"]}])")));
  EXPECT_TRUE(may_mount_a_cgroupfs(
      spec(R"([{"destination": "/d", "source": "/data", "options": ["rbind", "ro"]}])")));
  EXPECT_TRUE(may_mount_a_cgroupfs(
      spec(R"([{"destination": "/x", "type": "cgroup", "source": "cgroup"}])")));
}

// A bind that receives the host's later mounts would show a cgroupfs the hook never saw.
TEST(PinPrivatePropagation, SlaveOrSharedBindsAreRefusedOthersMadePrivate) {
  for (const char* opt : {"rslave", "slave", "rshared", "shared"}) {
    Json spec = Json::parse(cat(R"({"mounts": [{"destination": "/v", "type": "bind",
        "source": "/data", "options": ["rbind", ")",
                                opt, R"(", "ro"]}]})"));
    auto r = pin_private_propagation(spec);
    ASSERT_FALSE(r) << opt;
    EXPECT_NE(r.error().message.find(cat("asks for ", opt, " propagation")), std::string::npos)
        << r.error().message;
  }
  Json spec = Json::parse(R"({"mounts": [
      {"destination": "/proc", "type": "proc", "source": "proc"},
      {"destination": "/a", "type": "bind", "source": "/data"},
      {"destination": "/b", "source": "/data", "options": ["rbind", "ro"]},
      {"destination": "/c", "type": "bind", "source": "/data", "options": ["rbind", "rprivate"]}]})");
  auto r = pin_private_propagation(spec);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(*r);
  EXPECT_FALSE(spec["mounts"][0].contains("options")) << "not a bind: untouched";
  EXPECT_EQ(spec["mounts"][1]["options"], Json::parse(R"(["rprivate"])"));
  EXPECT_EQ(spec["mounts"][2]["options"], Json::parse(R"(["rbind", "ro", "rprivate"])"));
  EXPECT_EQ(spec["mounts"][3]["options"], Json::parse(R"(["rbind", "rprivate"])"));
  r = pin_private_propagation(spec);
  ASSERT_TRUE(r);
  EXPECT_FALSE(*r) << "containerd's CRI volumes (rprivate already) are left as they are";
}

TEST(ContainerCgroupMounts, PodChosenPathsInTheReasonAreEscaped) {
  std::string r = kRoot;
  auto st = judge(runc_v1_table(cat("97 60 0:33 / ", r, "/x\033[2J ro - cgroup cgroup rw\n")));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().message.find('\x1b'), std::string::npos) << st.error().message;
}

namespace {

// A child in a private mount namespace of its own runs `body`, which returns "" when every
// check held, else what failed; a body that cannot set up (no namespace, no cgroup fs to mount)
// returns Skip. Mounts made there never reach the host.
struct Skip {
  std::string why;
};
using ChildResult = std::variant<std::string, Skip>;

void in_private_mount_namespace(const std::function<ChildResult()>& body) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    ChildResult r = ::unshare(CLONE_NEWNS) != 0 ||
                            ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0
                        ? ChildResult(Skip{"unshare/make-private failed"})
                        : body();
    const Skip* skip = std::get_if<Skip>(&r);
    const std::string& what = skip ? skip->why : std::get<std::string>(r);
    (void)!::write(pipefd[1], what.data(), what.size());
    ::_exit(skip ? 77 : what.empty() ? 0 : 1);
  }
  ::close(pipefd[1]);
  char buf[256] = {};
  ssize_t n = ::read(pipefd[0], buf, sizeof buf - 1);
  ::close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  std::string why(buf, n > 0 ? static_cast<size_t>(n) : 0);
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << why;
  EXPECT_EQ(WEXITSTATUS(status), 0) << why;
}

bool mount_cgroupfs(const std::string& target) {
  return ::mount("cgroup2", target.c_str(), "cgroup2", 0, nullptr) == 0 ||
         ::mount("cgroup", target.c_str(), "cgroup", 0, "devices") == 0;
}

bool lists(const std::vector<std::string>& points, const std::string& p) {
  return std::find(points.begin(), points.end(), p) != points.end();
}

}  // namespace

// gpufence-nri keeps the host's cgroup mount points between decisions: a cgroup filesystem
// mounted (or unmounted) after the first read must be seen at the next decision, and an
// unchanged table is not read again.
TEST(CgroupMountPoints, AMountMadeAfterTheFirstReadIsSeenAtTheNext) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a cgroup filesystem";
  test::TempDir dir;
  const std::string target = (dir / "cg").string();
  std::filesystem::create_directories(target);
  in_private_mount_namespace([&]() -> ChildResult {
    CgroupMountPoints kept;
    auto first = kept.get();
    if (!first || lists(*first, target)) return "first read wrong";
    if (!kept.get() || kept.reads() != 1) return "an unchanged table was read again";
    if (!mount_cgroupfs(target)) return Skip{"no cgroup filesystem can be mounted here"};
    auto after = kept.get();
    if (!after || !lists(*after, target))
      return "the cgroupfs mounted after the first read was missed";
    if (::umount2(target.c_str(), MNT_DETACH) != 0) return "umount failed";
    auto gone = kept.get();
    if (!gone || lists(*gone, target)) return "the unmounted cgroupfs is still listed";
    if (kept.reads() != 3) return cat("read ", kept.reads(), " times, not 3");
    return "";
  });
}

// A rename of a directory above a cgroupfs mount point moves the mount but is no mount or unmount:
// the kernel marks nothing, so the kept table would name the old place and a bind of the new one
// would pass the early refusal (the cgroup-mounts hook still judges what was mounted). Each kept
// point is checked to be a cgroup filesystem still; with that check removed, this fails ("kept").
TEST(CgroupMountPoints, AMountMovedByARenameAboveItIsSeenAtTheNext) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a cgroup filesystem";
  test::TempDir dir;
  const std::string before = (dir / "a/b/cg").string(), after = (dir / "a/c/cg").string();
  std::filesystem::create_directories(before);
  in_private_mount_namespace([&]() -> ChildResult {
    if (!mount_cgroupfs(before)) return Skip{"no cgroup filesystem can be mounted here"};
    CgroupMountPoints kept;
    auto first = kept.get();
    if (!first || !lists(*first, before)) return "first read wrong";
    if (::rename((dir / "a/b").c_str(), (dir / "a/c").c_str()) != 0) return "rename failed";
    auto moved = kept.get();
    if (!moved || lists(*moved, before) || !lists(*moved, after))
      return "the moved cgroupfs is kept at its old place";
    if (kept.reads() != 2) return cat("read ", kept.reads(), " times, not 2");
    if (!kept.get() || kept.reads() != 2) return "an unchanged table was read again";
    ::umount2(after.c_str(), MNT_DETACH);
    return "";
  });
}
