#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <cstring>

#include "common/hostfs.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

TEST(HostFs, ResolvesEveryPathUnderItsRoot) {
  HostFs fs("/host");
  EXPECT_EQ(fs.resolve("/proc/1/status"), "/host/proc/1/status");
  EXPECT_EQ(fs.resolve("proc/1/status"), "/host/proc/1/status");
  EXPECT_EQ(fs.resolve("/"), "/host");
  EXPECT_EQ(HostFs("/").resolve("/dev/nvidia0"), "/dev/nvidia0");
}

TEST(HostFs, ReadsListsAndStatsAFakeRoot) {
  test::TempDir root;
  root.write("proc/42/environ", std::string("A=1\0B=2\0", 8));
  root.write("sys/bus/pci/devices/0000:01:00.0/numa_node", "1\n");
  std::filesystem::create_directories(root / "dev");
  if (::mknod((root / "dev/nvidia1").c_str(), S_IFCHR | 0666, makedev(195, 1)) != 0)
    GTEST_SKIP() << "mknod of a fake GPU node needs root: " << std::strerror(errno);
  std::filesystem::create_symlink("nvidia1", root / "dev/gpu-link");

  HostFs fs(root.path());
  auto environ = fs.read("/proc/42/environ");
  ASSERT_TRUE(environ);
  EXPECT_EQ(*environ, std::string("A=1\0B=2\0", 8));
  EXPECT_EQ(fs.read("/sys/bus/pci/devices/0000:01:00.0/numa_node").value(), "1\n");

  auto info = fs.stat("/dev/nvidia1");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->type, FileType::char_device);
  EXPECT_EQ(info->major, 195u);
  EXPECT_EQ(info->minor, 1u);
  EXPECT_EQ(fs.stat("/dev/gpu-link")->type, FileType::symlink);
  EXPECT_EQ(fs.read_link("/dev/gpu-link").value(), "nvidia1");

  auto entries = fs.list("/dev");
  ASSERT_TRUE(entries);
  EXPECT_EQ(*entries, (std::vector<std::string>{"gpu-link", "nvidia1"}));
  EXPECT_TRUE(fs.exists("/dev/nvidia1"));
  EXPECT_FALSE(fs.exists("/dev/nvidia0"));
}

TEST(HostFs, ErrorsNameTheRealPathAndTheCause) {
  test::TempDir root;
  HostFs fs(root.path());
  auto missing = fs.read("/proc/999999/status");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_NE(missing.error().message.find((root / "proc/999999/status").string()),
            std::string::npos);
  EXPECT_NE(missing.error().message.find("No such file"), std::string::npos);
  EXPECT_FALSE(fs.list("/nope"));
  EXPECT_FALSE(fs.stat("/nope"));
}

// The host's absolute links (Debian's /var/run -> /run) name the host's files under the root,
// never this process's (a doctor or installer pod with the host at /host).
TEST(HostFs, AbsoluteLinksOfTheHostResolveUnderItsRoot) {
  test::TempDir dir, outside;
  outside.write("run/cdi/spec.json", "this process's file");
  std::filesystem::path link_target = outside / "run";  // what "/run" would be without the root
  dir.write("run/cdi/spec.json", "the host's file");
  std::filesystem::create_directories(dir / "var");
  std::filesystem::create_symlink("/run", dir / "var/run");
  // A link whose target exists only outside the root: unresolvable under it.
  std::filesystem::create_directories(dir / "etc");
  std::filesystem::create_symlink(link_target / "cdi/spec.json", dir / "etc/elsewhere.json");
  HostFs fs(dir.path());
  auto text = fs.read("/var/run/cdi/spec.json");
  ASSERT_TRUE(text) << text.error().message;
  EXPECT_EQ(*text, "the host's file");
  auto names = fs.list("/var/run/cdi");
  ASSERT_TRUE(names) << names.error().message;
  EXPECT_EQ(*names, (std::vector<std::string>{"spec.json"}));
  EXPECT_TRUE(fs.exists("/var/run/cdi/spec.json"));
  auto info = fs.stat("/var/run");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->type, FileType::symlink);
  EXPECT_EQ(*fs.read_link("/var/run"), "/run");
  EXPECT_FALSE(fs.read("/etc/elsewhere.json")) << "read a file outside the root";
  EXPECT_FALSE(fs.exists("/var/run/../../../../../../" + (outside / "run/cdi/spec.json").string()));
}

// A file planted where a config is read cannot take the node's memory: past kMaxReadBytes (a
// sparse file costs the planter nothing) the read is a clear error, not std::bad_alloc. read_own
// refuses a link as the last component; read follows it, as the host's programs do.
TEST(HostFs, ReadsAreBoundedAndReadOwnFollowsNoLink) {
  test::TempDir d;
  d.write("etc/big.toml", "");
  ASSERT_EQ(::truncate((d / "etc/big.toml").c_str(), HostFs::kMaxReadBytes + 1), 0);
  d.write("etc/real.toml", "x = 1\n");
  std::filesystem::create_symlink("real.toml", d / "etc/link.toml");
  for (const std::string& root : {d.path().string(), std::string("/")}) {
    const HostFs host(root);
    const std::string base = root == "/" ? d.path().string() : "";
    auto big = host.read(base + "/etc/big.toml");
    ASSERT_FALSE(big) << root;
    EXPECT_NE(big.error().message.find("larger than"), std::string::npos) << big.error().message;
    EXPECT_EQ(host.read(base + "/etc/link.toml").value_or(""), "x = 1\n") << root;
    EXPECT_EQ(host.read_own(base + "/etc/real.toml").value_or(""), "x = 1\n") << root;
    EXPECT_FALSE(host.read_own(base + "/etc/link.toml")) << root << ": a link was followed";
  }
}

TEST(HostPathArg, RelativePathsAreTheCurrentDirectoryOnlyWhenTheHostIsThisMachine) {
  test::TempDir dir;
  auto old = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  auto mine = host_path_arg("etc/../containerd/config.toml", "--config", "/");
  auto unset = host_path_arg("config.toml", "--config", "");
  auto under_host = host_path_arg("config.toml", "--containerd-config", "/host");
  std::filesystem::current_path(old);
  ASSERT_TRUE(mine) << mine.error().message;
  EXPECT_EQ(*mine, (dir / "containerd/config.toml").string()) << "absolute and normal";
  ASSERT_TRUE(unset) << unset.error().message;
  EXPECT_EQ(*unset, (dir / "config.toml").string());
  // Under /host a relative path would name a file of the pod the command runs in.
  ASSERT_FALSE(under_host);
  EXPECT_EQ(under_host.error().code, Errc::invalid_argument);
  EXPECT_NE(under_host.error().message.find("--containerd-config config.toml is relative"),
            std::string::npos)
      << under_host.error().message;
  EXPECT_EQ(host_path_arg("/etc/containerd/config.toml", "--config", "/host").value_or("?"),
            "/etc/containerd/config.toml")
      << "an absolute path is the host's, as given";
  EXPECT_EQ(host_path_arg("", "--drop-in", "/host").value_or("?"), "") << "flag not given";
}

// A socket's path under a host root follows the host's absolute links inside the root: with
// /var/run -> /run, /var/run/nri/nri.sock is the root's run/nri/nri.sock, reachable by connect(2)
// through the held directory, never this process's own /run.
TEST(HostFs, SocketPathsFollowTheHostsLinksInsideTheRoot) {
  test::TempDir root;
  std::filesystem::create_directories(root / "run/nri");
  std::filesystem::create_directories(root / "var");
  std::filesystem::create_symlink("/run", root / "var/run");
  HostFs host(root.path());
  auto sock = host.socket_path("/var/run/nri/nri.sock");
  ASSERT_TRUE(sock) << sock.error().message;
  ASSERT_TRUE(sock->path.starts_with("/proc/self/fd/")) << sock->path;
  EXPECT_EQ(std::filesystem::canonical(std::filesystem::path(sock->path).parent_path()),
            std::filesystem::canonical(root / "run/nri"));
  EXPECT_TRUE(sock->path.ends_with("/nri.sock"));
  EXPECT_FALSE(host.socket_path("relative/nri.sock"));
  EXPECT_FALSE(host.socket_path("/no/such/dir/nri.sock"));
}
