#include <gtest/gtest.h>
#include <unistd.h>

#include "runtime/runc_args.hpp"

using namespace gpufence;

TEST(RuncArgs, ContainerdRuncShimCommandLine) {
  // Exactly what containerd 1.6's runc v2 shim passed to a wrapper binary (field notes).
  auto inv = parse_runc_args({"--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json",
                              "--log-format", "json", "create", "--bundle", "/run/x/abc",
                              "--pid-file", "/run/x/init.pid", "abc"});
  ASSERT_TRUE(inv);
  EXPECT_EQ(inv->subcommand, "create");
  EXPECT_EQ(inv->bundle, "/run/x/abc");
  EXPECT_EQ(inv->container_id, "abc");
  EXPECT_TRUE(inv->edits_spec());
}

TEST(RuncArgs, FlagFormsAndBooleans) {
  auto inv = parse_runc_args({"--debug", "--systemd-cgroup", "-root=/r", "run", "-d", "-b", "/b",
                              "--keep", "--console-socket=/s", "ctr"});
  ASSERT_TRUE(inv);
  EXPECT_EQ(inv->subcommand, "run");
  EXPECT_EQ(inv->bundle, "/b");
  EXPECT_EQ(inv->container_id, "ctr");
  auto eq = parse_runc_args({"create", "--bundle=/eq", "--preserve-fds", "2", "id1"});
  EXPECT_EQ(eq->bundle, "/eq");
  EXPECT_EQ(eq->container_id, "id1");
}

TEST(RuncArgs, BundleDefaultsToWorkingDirectoryAndRelativeIsAnchored) {
  char cwd[4096];
  ASSERT_TRUE(::getcwd(cwd, sizeof cwd));
  EXPECT_EQ(parse_runc_args({"create", "id"})->bundle, cwd);
  EXPECT_EQ(parse_runc_args({"create", "-b", "rel", "id"})->bundle, std::string(cwd) + "/rel");
}

TEST(RuncArgs, OtherCommandsAreNotEdited) {
  for (const char* cmd : {"start", "state", "kill", "delete", "exec", "ps", "events", "features"}) {
    auto inv = parse_runc_args({"--root", "/r", cmd, "id"});
    ASSERT_TRUE(inv);
    EXPECT_EQ(inv->subcommand, cmd);
    EXPECT_FALSE(inv->edits_spec());
  }
  EXPECT_EQ(parse_runc_args({"--version"})->subcommand, "");
  EXPECT_EQ(parse_runc_args({"--help"})->subcommand, "");
  EXPECT_EQ(parse_runc_args({})->subcommand, "");
  // "--root create" is a value, not the subcommand.
  EXPECT_EQ(parse_runc_args({"--root", "create", "state", "x"})->subcommand, "state");
}

TEST(RuncArgs, MissingFlagValueIsAnError) {
  auto inv = parse_runc_args({"create", "--bundle"});
  ASSERT_FALSE(inv);
  EXPECT_NE(inv.error().message.find("--bundle"), std::string::npos);
}

TEST(RuncArgs, GlobalLogFlagsAndSystemdCgroupAreRead) {
  auto inv = parse_runc_args({"--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json",
                              "--log-format", "json", "--systemd-cgroup", "create", "--bundle",
                              "/b", "--pid-file", "/b/init.pid", "c1"});
  ASSERT_TRUE(inv);
  EXPECT_EQ(inv->log_path, "/b/log.json");
  EXPECT_EQ(inv->log_format, "json");
  EXPECT_TRUE(inv->systemd_cgroup);
  EXPECT_EQ(inv->container_id, "c1");
  auto eq =
      parse_runc_args({"--log=/l", "--log-format=text", "--systemd-cgroup=false", "run", "x"});
  ASSERT_TRUE(eq);
  EXPECT_EQ(eq->log_path, "/l");
  EXPECT_EQ(eq->log_format, "text");
  EXPECT_FALSE(eq->systemd_cgroup);
  EXPECT_EQ(parse_runc_args({"--log"})->subcommand, "") << "left to runc to report";
}

TEST(RuncArgs, RestoreCreatesFromTheSpecAndIsEdited) {
  auto inv = parse_runc_args({"--root", "/r", "restore", "--image-path", "/ckpt", "--work-path",
                              "/w", "--tcp-established", "--manage-cgroups-mode", "soft",
                              "--bundle", "/b", "--detach", "c9"});
  ASSERT_TRUE(inv);
  EXPECT_TRUE(inv->edits_spec());
  EXPECT_EQ(inv->bundle, "/b");
  EXPECT_EQ(inv->container_id, "c9");
}
