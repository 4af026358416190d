// Attacks on `gpufence doctor` by what a hostile pod controls: its env bytes, annotations that
// runc turns into labels, cgroups below its own, FIFOs where the doctor reads, and a probe that
// never returns (docs/trust-model.md, "Files a pod controls, read from the host"). Each case
// failed on the code before its fix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "common/hostfs.hpp"
#include "doctor/checks.hpp"
#include "doctor/gather.hpp"
#include "doctor/parse.hpp"
#include "doctor/process_dir.hpp"
#include "doctor/report.hpp"
#include "pod_resources_server.hpp"
#include "support/fake_node.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

// Runs `work` aside and waits at most 5 s: what used to block forever must not block the test.
template <typename F>
bool finishes(F work) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([work, done]() mutable {
    work();
    *done = true;
  }).detach();
  for (int i = 0; i < 100 && !*done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return *done;
}

class DoctorHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    m_node = std::make_unique<test::FakeNode>(m_dir.path());
    m_inv.list = test::fake_gpus(2);
    m_node->install_gpufence_handler();
  }
  void kubelet(std::vector<test::PodAllocation> allocations) {
    m_server = std::make_unique<test::PodResourcesServer>(
        (m_dir / "var/lib/kubelet/pod-resources/kubelet.sock").string(), "nvidia.com/gpu",
        allocations, std::vector<std::string>{m_inv.list[0].uuid, m_inv.list[1].uuid});
    ASSERT_TRUE(m_server->start());
  }
  Snapshot snapshot(GatherOptions opt = {}) {
    return gather_snapshot(HostFs(m_dir.path()), opt, {.inventory = m_inv});
  }
  std::string task_dir(const std::string& id) {
    return "run/containerd/io.containerd.runtime.v2.task/k8s.io/" + id;
  }

  test::TempDir m_dir;
  std::unique_ptr<test::FakeNode> m_node;
  test::FakeInventory m_inv;
  std::unique_ptr<test::PodResourcesServer> m_server;
};

// A container that asked for no GPU and can open both, with a hostile env value.
test::FakeContainer leaking(const std::string& env_value) {
  test::FakeContainer c;
  c.pod = "evil";
  c.pids = {100};
  c.env = "NVIDIA_VISIBLE_DEVICES=" + env_value + std::string(1, '\0');
  c.devices_list = "c 195:* rw\n";
  return c;
}

}  // namespace

// The env value lands in the evidence of gpu.no-request-can-open. Raw, it cleared the reader's
// screen and printed a line that looks like the doctor's own.
TEST_F(DoctorHostile, AnEnvValueCannotDriveTheTerminalOrForgeReportLines) {
  m_node->add(leaking("all\x1b[2J\x1b[H\r\n- [gpu.ok] every GPU is allocated right\x07\xc2\x9b"));
  kubelet({{"default", "evil", "main", {}}});
  auto snap = snapshot();
  auto findings = judge(snap);
  ASSERT_FALSE(findings.empty());
  std::string text = render_doctor_text(snap, findings);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.find('\x07'), std::string::npos) << text;
  EXPECT_EQ(text.find("\xc2\x9b"), std::string::npos) << "a C1 CSI passed: " << text;
  EXPECT_EQ(text.find("\n- [gpu.ok]"), std::string::npos) << "a forged finding line: " << text;
  // Still said, escaped: the reader sees what the env holds.
  EXPECT_NE(text.find("all\\x1b[2J"), std::string::npos) << text;
  EXPECT_NE(text.find("\\x0d\\x0a- [gpu.ok]"), std::string::npos) << text;
}

// Env bytes are any bytes; nlohmann's default dump throws on invalid UTF-8, which ended the
// doctor with an uncaught exception instead of a report.
TEST_F(DoctorHostile, EnvBytesThatAreNotUtf8KeepTheJsonReportValid) {
  m_node->add(leaking(std::string("GPU-\xff\xfe\x1b[31m\"}") + "\n"));
  kubelet({{"default", "evil", "main", {}}});
  auto snap = snapshot();
  auto findings = judge(snap);
  auto doc = render_doctor_json(snap, findings);
  EXPECT_ANY_THROW((void)doc.dump(2)) << "control: the default dump is what used to run";
  std::string text;
  ASSERT_NO_THROW(text = report_json_text(doc));
  for (unsigned char ch : text) ASSERT_LT(ch, 0x80) << "non-ASCII byte in the JSON report";
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  auto back = nlohmann::json::parse(text);  // valid JSON
  ASSERT_EQ(back["containers"].size(), 1u);
  EXPECT_EQ(back["containers"][0]["nvidia_visible_devices"].get<std::string>(),
            "GPU-\xef\xbf\xbd\xef\xbf\xbd\x1b[31m\"}\n");
  ASSERT_FALSE(back["findings"].empty());
  EXPECT_EQ(back["findings"][0]["id"], "gpu.no-request-can-open");
}

// runc makes every OCI annotation a "key=value" label and appends its own "bundle=" last. A
// passed-through annotation "bundle" named a config.json of the pod's choosing, one that called
// the container a sandbox (never judged) or another pod.
TEST_F(DoctorHostile, AnAnnotationNamedBundleDoesNotPickTheBundle) {
  auto c = leaking("all");
  std::string id = m_node->add(c);
  // Not a containerd task: only runc's state says where the bundle is.
  std::filesystem::path real = m_dir / "bundles" / id;
  std::filesystem::create_directories(real);
  std::filesystem::rename(m_dir / task_dir(id) / "config.json", real / "config.json");
  // The pod's own file, e.g. in its rootfs's upper dir, which /proc/self/mountinfo shows it.
  m_node->write("var/lib/evil/config.json",
                "{\"annotations\":{\"io.kubernetes.cri.sandbox-name\":\"evil\","
                "\"io.kubernetes.cri.container-type\":\"sandbox\"}}");
  m_node->write("run/runc/" + id + "/state.json",
                "{\"config\":{\"labels\":[\"bundle=/var/lib/evil\",\"io.kubernetes.cri.sandbox-"
                "name=evil\",\"bundle=/bundles/" +
                    id + "\"]}}");
  kubelet({{"default", "evil", "main", {}}});
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u) << "the container was hidden as a sandbox";
  EXPECT_EQ(snap.containers[0].bundle, "/bundles/" + id);
  auto findings = judge(snap);
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].id, "gpu.no-request-can-open");
}

// A process of the container in a cgroup below the container's own (systemd's init.scope, a
// nested runtime, or a container with a writable cgroupfs hiding) is still that container.
TEST_F(DoctorHostile, ACgroupBelowTheContainersOwnDoesNotHideIt) {
  std::string id = m_node->add(leaking("all"));
  std::string cg = "/kubepods/besteffort/podevil/" + id + "/hide";
  m_node->write("proc/100/cgroup", "12:pids:" + cg + "\n5:devices:" + cg + "\n");
  m_node->write("sys/fs/cgroup/devices" + cg + "/devices.list", "c 195:* rw\n");
  EXPECT_EQ(
      container_id_from_cgroup("0::/kubepods.slice/cri-containerd-" + id + ".scope/init.scope\n"),
      id);
  kubelet({{"default", "evil", "main", {}}});
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_EQ(snap.containers[0].id, id);
  auto findings = judge(snap);
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].id, "gpu.no-request-can-open");
}

// Worse, the cgroup below can carry another container's id: judged by its last component, the
// pod's process and its GPU use were the victim's (the victim's pod name, its allocation).
TEST_F(DoctorHostile, ACgroupNamedAfterAnotherContainerDoesNotBorrowItsIdentity) {
  test::FakeContainer victim;
  victim.pod = "victim";
  victim.pids = {200};
  victim.devices_list = "c 195:0 rw\n";
  std::string victim_id = m_node->add(victim);
  std::string id = m_node->add(leaking("all"));
  std::string cg = "/kubepods/besteffort/podevil/" + id + "/cri-containerd-" + victim_id + ".scope";
  m_node->write("proc/100/cgroup", "5:devices:" + cg + "\n");
  m_node->write("sys/fs/cgroup/devices" + cg + "/devices.list", "c 195:* rw\n");
  m_inv.procs[m_inv.list[1].uuid] = {{100, 1}};  // the pod's process on GPU 1
  kubelet({{"default", "evil", "main", {}}, {"default", "victim", "main", {m_inv.list[0].uuid}}});
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 2u);
  for (const auto& c : snap.containers) {
    if (c.pod == "victim") {
      EXPECT_EQ(c.pids, std::vector<unsigned>{200});
    } else {
      EXPECT_EQ(c.pod, "evil");
      EXPECT_EQ(c.pids, std::vector<unsigned>{100});
    }
  }
  bool evil_named = false;
  for (const auto& f : judge(snap))
    evil_named |= f.id == "gpu.no-request-can-open" &&
                  f.summary.find("default/evil/main") != std::string::npos;
  EXPECT_TRUE(evil_named);
}

// Every host read (bundles, runc state, /proc, /sys) refuses what is not a regular file instead
// of blocking on a FIFO, at "/" as under --host-root.
TEST(DoctorHostileHostFs, AFifoOnTheHostIsRefusedNotWaitedOn) {
  test::TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0644), 0);
  auto under_root = std::make_shared<Result<std::string>>(std::string());
  auto at_slash = std::make_shared<Result<std::string>>(std::string());
  std::string abs = (dir / "config.json").string();
  ASSERT_TRUE(finishes([&, under_root] { *under_root = HostFs(dir.path()).read("/config.json"); }))
      << "blocked on a FIFO under a --host-root";
  ASSERT_TRUE(finishes([abs, at_slash] { *at_slash = HostFs("/").read(abs); }))
      << "blocked on a FIFO at /";
  ASSERT_FALSE(under_root->has_value());
  EXPECT_NE(under_root->error().message.find("not a regular file"), std::string::npos);
  ASSERT_FALSE(at_slash->has_value());
  EXPECT_NE(at_slash->error().message.find("not a regular file"), std::string::npos);
}

// On cgroup v2 the probe child joins the container's whole cgroup, which a container that can
// write it freezes. Here its join never returns (a FIFO stands in for the frozen cgroup.procs):
// the doctor kills the child and says so, instead of waiting forever.
TEST(DoctorHostileProbe, AProbeThatNeverReturnsIsKilled) {
  test::TempDir dir;
  std::string procs = (dir / "cgroup.procs").string();
  ASSERT_EQ(::mkfifo(procs.c_str(), 0600), 0);
  auto result = std::make_shared<Result<std::set<unsigned>>>(std::set<unsigned>{});
  unsigned self = static_cast<unsigned>(::getpid());
  bool done = finishes([procs, result, self] {
    *result = probe_gpu_access(HostFs("/"), self, procs, {}, std::chrono::milliseconds(300));
  });
  if (!done) {
    // Let the stuck child go (a reader opens the FIFO), so no process outlives the test.
    int unblock = ::open(procs.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (unblock >= 0) ::close(unblock);
  }
  ASSERT_TRUE(done) << "the doctor waited on a probe that never returns";
  ASSERT_FALSE(result->has_value());
  EXPECT_NE(result->error().message.find("did not finish"), std::string::npos)
      << result->error().message;
}

// A process of the container with an environ larger than exec allows (PR_SET_MM with
// CAP_SYS_RESOURCE can point it at any mapping): not read into memory, and said so.
TEST_F(DoctorHostile, AnEnvironBeyondWhatExecAllowsIsNotRead) {
  m_node->add(leaking(std::string(kMaxEnvironBytes, 'x')));
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_FALSE(snap.containers[0].nvidia_visible_devices.has_value()) << "read it whole";
  bool named = false;
  for (const auto& sk : snap.skipped) named |= sk.find("larger than") != std::string::npos;
  EXPECT_TRUE(named);
}

namespace {

// A child that execs `sleep 60` with `env`, at `want_pid` if not 0 (clone3 set_tid, root only).
pid_t spawn_sleeper(const char* env, pid_t want_pid) {
  // struct clone_args of linux/sched.h up to set_tid_size (CLONE_ARGS_SIZE_VER1, Linux 5.5).
  struct {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size;
  } args{};
  args.exit_signal = SIGCHLD;
  if (want_pid != 0) {
    args.set_tid = reinterpret_cast<uint64_t>(&want_pid);
    args.set_tid_size = 1;
  }
  long child = ::syscall(SYS_clone3, &args, sizeof args);
  if (child == 0) {
    const char* argv[] = {"sleep", "60", nullptr};
    const char* envp[] = {env, nullptr};
    ::execve("/bin/sleep", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ::_exit(127);
  }
  return static_cast<pid_t>(child);
}

bool wait_exec(pid_t pid, const std::string& marker) {
  for (int i = 0; i < 2000; ++i) {  // 20 s: the exec may wait for a loaded machine
    auto env = HostFs("/").read("/proc/" + std::to_string(pid) + "/environ");
    if (env && env->find(marker) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

// The pid the doctor saw in a container's cgroup exits and is given to another process (here
// deterministically, with clone3's set_tid). Read by path, /proc/<pid>/environ is then the other
// process's; read through the held /proc directory, it is an error.
TEST(DoctorHostileProcessDir, AReusedPidIsNotReadAsTheProcessThatWasSeen) {
  pid_t first = spawn_sleeper("WHO=first", 0);
  ASSERT_GT(first, 0) << std::strerror(errno);
  ASSERT_TRUE(wait_exec(first, "WHO=first"));
  auto held = ProcessDir::open(HostFs("/"), static_cast<unsigned>(first));
  ASSERT_TRUE(held.has_value());
  auto env = held->read("environ");
  ASSERT_TRUE(env.has_value());
  EXPECT_NE(env->find("WHO=first"), std::string::npos);
  ::kill(first, SIGKILL);
  ::waitpid(first, nullptr, 0);
  pid_t second = spawn_sleeper("WHO=second", first);
  if (second <= 0) GTEST_SKIP() << "clone3 with set_tid: " << std::strerror(errno);
  ASSERT_EQ(second, first);
  ASSERT_TRUE(wait_exec(second, "WHO=second")) << "control: the pid was reused";
  auto again = held->read("environ");
  EXPECT_FALSE(again.has_value() && again->find("WHO=second") != std::string::npos)
      << "read the process that got the pid later";
  EXPECT_FALSE(held->read("cgroup").has_value());
  EXPECT_FALSE(held->root().has_value());
  ::kill(second, SIGKILL);
  ::waitpid(second, nullptr, 0);
}

// The probe writes only into a cgroup: a path that names a plain file (a cgroup path seen from
// another cgroup namespace, "/../..", lands outside /sys/fs/cgroup) is refused. Before, the child
// wrote its pid into the file, stayed in the doctor's own cgroup and reported what that allows.
TEST(DoctorHostileProbe, TheProbeWritesOnlyIntoACgroupFilesystem) {
  test::TempDir dir;
  auto procs = dir.write("kubepods/cgroup.procs", "");
  auto probed = probe_gpu_access(HostFs("/"), static_cast<unsigned>(::getpid()), procs.string(), {},
                                 std::chrono::milliseconds(5000));
  EXPECT_FALSE(probed.has_value()) << "joined a plain file";
  auto text = HostFs("/").read(procs.string());
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(*text, "") << "the probe wrote into a host file";
}

// From a pod in its own cgroup namespace, other containers' cgroups read "/../../kubepods/...":
// not a path under /sys/fs/cgroup. Neither read nor probed there; the OCI rules decide.
TEST_F(DoctorHostile, ACgroupPathFromAnotherNamespaceIsNotFollowed) {
  auto c = leaking("all");
  c.devices_list = "c 1:3 rwm\n";
  std::string id = m_node->add(c);
  std::string cg = "/../kubepods/besteffort/podevil/" + id;
  m_node->write("proc/100/cgroup", "5:devices:" + cg + "\n");
  // What "/sys/fs/cgroup/devices/.." + the rest names: a list that lets it open every GPU.
  m_node->write("sys/fs/cgroup/kubepods/besteffort/podevil/" + id + "/devices.list",
                "c 195:* rw\n");
  auto snap = snapshot();
  ASSERT_EQ(snap.containers.size(), 1u);
  EXPECT_EQ(snap.containers[0].openable_source, "oci-spec rules");
  bool named = false;
  for (const auto& sk : snap.skipped)
    named |= sk.find("outside the doctor's cgroup namespace") != std::string::npos;
  EXPECT_TRUE(named);
}

// Only EPERM is the devices cgroup saying no. Before, every failed open counted as denied: an
// ENOMEM in a v2 cgroup held at memory.max or an EACCES hid a GPU the container can open.
TEST(DoctorHostileProbe, OnlyEpermIsADenial) {
  EXPECT_EQ(probe_open_verdict(EPERM), ProbeOpen::denied);
  EXPECT_EQ(probe_open_verdict(0), ProbeOpen::allowed);
  EXPECT_EQ(probe_open_verdict(ENXIO), ProbeOpen::allowed);
  for (int e : {ENOMEM, EACCES, EINTR, EBUSY, EMFILE, ENOENT})
    EXPECT_EQ(probe_open_verdict(e), ProbeOpen::inconclusive) << std::strerror(e);
}

// The same with a real open: the container's /dev/nvidia0 (195:0) on a nodev mount, which the
// kernel refuses with EACCES whatever the cgroup says. The probe must call that inconclusive,
// not "cannot open GPU 0". Runs in a forked child, alone in a private mount namespace.
TEST(DoctorHostileProbe, AnOpenRefusedForAnotherReasonIsNotADenial) {
  test::TempDir dir;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto rootfs = dir / "rootfs";
    std::error_code ec;
    std::filesystem::create_directories(rootfs, ec);
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", rootfs.c_str(), "tmpfs", MS_NODEV, "size=1m") != 0 ||
        ::mkdir((rootfs / "dev").c_str(), 0755) != 0 ||
        ::mknod((rootfs / "dev/nvidia0").c_str(), S_IFCHR | 0666, makedev(195, 0)) != 0)
      ::_exit(77);
    unsigned me = static_cast<unsigned>(::getpid());
    auto proc = dir / "host/proc" / std::to_string(me);
    std::filesystem::create_directories(proc, ec);
    std::filesystem::create_directory_symlink(rootfs, proc / "root", ec);
    auto own = HostFs("/").read("/proc/self/cgroup");
    if (!own) ::_exit(77);
    auto v1 = cgroup_path(*own, "devices");
    std::string procs =
        v1 ? "/sys/fs/cgroup/devices" + *v1 + "/cgroup.procs"
           : "/sys/fs/cgroup" + cgroup_path(*own, "").value_or("/") + "/cgroup.procs";
    auto r =
        probe_gpu_access(HostFs(dir / "host"), me, procs, {0}, std::chrono::milliseconds(5000));
    if (!r) ::_exit(r.error().message.find("inconclusive") != std::string::npos ? 0 : 2);
    ::_exit(r->contains(0) ? 3 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "needs root to mount a nodev tmpfs and mknod";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: the EACCES was taken as the cgroup denying GPU 0; 2: the probe failed otherwise; "
         "3: reported as openable";
}

// The container's DeepStream config, 1 MiB of the same bad key: one finding, not one per line.
TEST_F(DoctorHostile, ARepeatedGpuIdMakesOneFinding) {
  auto c = leaking("0");
  c.devices_list = "c 195:0 rw\n";
  c.dev_minors = {0};
  std::string flood;
  while (flood.size() < 900000) flood += "[primary-gie]\ngpu-id=7\n";
  c.files["/opt/app/ds.txt"] = flood;
  m_node->add(c);
  kubelet({{"default", "evil", "main", {m_inv.list[0].uuid}}});
  GatherOptions opt;
  opt.app_configs = {"/opt/app/ds.txt"};
  auto findings = judge(snapshot(opt));
  size_t n = 0;
  for (const auto& f : findings) n += f.id == "deepstream.gpu-id-invisible";
  EXPECT_EQ(n, 1u);
}

// What passes and what is escaped: UTF-8 text stays readable; overlong forms, surrogates, a
// truncated sequence and a lone backslash are written so that the report is unambiguous.
TEST_F(DoctorHostile, TextEscapingKeepsUtf8AndEscapesTheRest) {
  m_node->add(leaking("\xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82 \\x41 \xc0\xaf\xed\xa0\x80\xe6\x97"));
  kubelet({{"default", "evil", "main", {}}});
  auto snap = snapshot();
  std::string text = render_doctor_text(snap, judge(snap));
  EXPECT_NE(text.find("NVIDIA_VISIBLE_DEVICES=\xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82 \\\\x41 "
                      "\\xc0\\xaf\\xed\\xa0\\x80\\xe6\\x97\n"),
            std::string::npos)
      << text;
}
