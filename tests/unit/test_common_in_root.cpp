// common/in_root: a container's files opened from the host stay inside its root. Each case plants
// what a hostile image would (absolute links, "..", a FIFO, a look-alike device node) and checks
// that nothing outside the root is reached.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>

#include "common/in_root.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

}  // namespace

TEST(InRoot, LinksAndDotDotResolveInsideTheRoot) {
  test::TempDir host, root;
  write(host / "secret", "host secret");
  write(root / "etc/own", "the container's");
  std::filesystem::create_symlink(host / "secret", root / "abs-link");
  std::filesystem::create_symlink("../../../../../../.." + (host / "secret").string(),
                                  root / "dotdot-link");
  auto r = open_root_dir(root.path());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(read_regular_in_root(r->fd, "/abs-link")) << "followed an absolute link out";
  EXPECT_FALSE(read_regular_in_root(r->fd, "/dotdot-link")) << "followed .. out of the root";
  EXPECT_FALSE(read_regular_in_root(r->fd, "/../../../../" + (host / "secret").string()));
  // The same absolute link resolves to the container's own file of that name.
  write(root.path() / (host / "secret").relative_path(), "inside");
  auto in = read_regular_in_root(r->fd, "/abs-link");
  ASSERT_TRUE(in) << in.error().message;
  EXPECT_EQ(*in, "inside");
  EXPECT_EQ(*read_regular_in_root(r->fd, "etc/own"), "the container's");
}

TEST(InRoot, OnlyRegularFilesAreReadAndOnlySoMuch) {
  test::TempDir root;
  ASSERT_EQ(::mkfifo((root / "fifo").c_str(), 0644), 0);
  std::filesystem::create_directories(root / "dir");
  write(root / "big", std::string(5000, 'x'));
  auto r = open_root_dir(root.path());
  ASSERT_TRUE(r);
  auto fifo = read_regular_in_root(r->fd, "/fifo");  // would block without O_NONBLOCK
  ASSERT_FALSE(fifo);
  EXPECT_NE(fifo.error().message.find("not a regular file"), std::string::npos)
      << fifo.error().message;
  EXPECT_FALSE(read_regular_in_root(r->fd, "/dir"));
  EXPECT_FALSE(read_regular_in_root(r->fd, "/big", 4096));
  EXPECT_TRUE(read_regular_in_root(r->fd, "/big", 8192));
}

TEST(InRoot, ListingADirectoryStaysInside) {
  test::TempDir host, root;
  write(host / "dev/nvidia1", "");
  std::filesystem::create_directory_symlink(host / "dev", root / "dev");
  auto r = open_root_dir(root.path());
  ASSERT_TRUE(r);
  EXPECT_FALSE(list_in_root(r->fd, "/dev")) << "listed the host's directory";
  write(root.path() / (host / "dev").relative_path() / "nvidia0", "");
  auto names = list_in_root(r->fd, "/dev");
  ASSERT_TRUE(names) << names.error().message;
  EXPECT_EQ(*names, (std::vector<std::string>{"nvidia0"}));
}

TEST(InRoot, ACharDeviceCountsOnlyAsItselfWithItsNumbers) {
  if (::geteuid() != 0) GTEST_SKIP() << "mknod of character devices needs root";
  test::TempDir host, root;
  std::filesystem::create_directories(root / "dev");
  ASSERT_EQ(::mknod((host / "nvidia0").c_str(), S_IFCHR | 0600, makedev(195, 0)), 0);
  // A link to the host's node, by absolute path, where the container's node would be.
  std::filesystem::create_symlink(host / "nvidia0", root / "dev/nvidia0");
  ASSERT_EQ(::mknod((root / "dev/nvidia1").c_str(), S_IFCHR | 0600, makedev(195, 2)), 0);
  ASSERT_EQ(::mknod((root / "dev/nvidia2").c_str(), S_IFCHR | 0600, makedev(195, 2)), 0);
  write(root / "dev/nvidia3", "");
  auto r = open_root_dir(root.path());
  ASSERT_TRUE(r);
  EXPECT_FALSE(char_device_in_root(r->fd, "/dev/nvidia0", 195, 0)) << "followed a link to the host";
  EXPECT_FALSE(char_device_in_root(r->fd, "/dev/nvidia1", 195, 1)) << "another minor's node";
  EXPECT_TRUE(char_device_in_root(r->fd, "/dev/nvidia2", 195, 2));
  EXPECT_FALSE(char_device_in_root(r->fd, "/dev/nvidia3", 195, 3)) << "a regular file";
  EXPECT_FALSE(char_device_in_root(r->fd, "/dev/nvidia4", 195, 4)) << "absent";
}
