#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runtime/runc_args.hpp"

using namespace gpufence;

TEST(RuncArgs, ContainerdRuncShimCommandLine) {
  // Exactly what containerd 1.6's runc v2 shim passed to a wrapper binary (field notes).
  auto inv = parse_runc_args({"--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json",
                              "--log-format", "json", "create", "--bundle", "/run/x/abc",
                              "--pid-file", "/run/x/init.pid", "abc"});
  ASSERT_EQ(inv.unreadable, "");
  EXPECT_EQ(inv.subcommand, "create");
  EXPECT_EQ(inv.bundle, "/run/x/abc");
  EXPECT_EQ(inv.container_id, "abc");
  EXPECT_TRUE(inv.edits_spec());
}

TEST(RuncArgs, FlagFormsAndBooleans) {
  auto inv = parse_runc_args({"--debug", "--systemd-cgroup", "-root=/r", "run", "-d", "-b", "/b",
                              "--keep", "--console-socket=/s", "ctr"});
  ASSERT_EQ(inv.unreadable, "");
  EXPECT_EQ(inv.subcommand, "run");
  EXPECT_EQ(inv.bundle, "/b");
  EXPECT_EQ(inv.container_id, "ctr");
  auto eq = parse_runc_args({"create", "--bundle=/eq", "--preserve-fds", "2", "id1"});
  EXPECT_EQ(eq.bundle, "/eq");
  EXPECT_EQ(eq.container_id, "id1");
}

TEST(RuncArgs, BundleDefaultsToWorkingDirectoryAndRelativeIsAnchored) {
  char cwd[4096];
  ASSERT_TRUE(::getcwd(cwd, sizeof cwd));
  EXPECT_EQ(parse_runc_args({"create", "id"}).bundle, cwd);
  EXPECT_EQ(parse_runc_args({"create", "-b", "rel", "id"}).bundle, std::string(cwd) + "/rel");
}

TEST(RuncArgs, OtherCommandsAreNotEdited) {
  for (const char* cmd : {"start", "state", "kill", "delete", "exec", "ps", "events", "features"}) {
    auto inv = parse_runc_args({"--root", "/r", cmd, "id"});
    ASSERT_EQ(inv.unreadable, "");
    EXPECT_EQ(inv.subcommand, cmd);
    EXPECT_FALSE(inv.edits_spec());
  }
  EXPECT_EQ(parse_runc_args({"--version"}).subcommand, "");
  EXPECT_EQ(parse_runc_args({"--help"}).subcommand, "");
  EXPECT_EQ(parse_runc_args({}).subcommand, "");
  // "--root create" is a value, not the subcommand.
  EXPECT_EQ(parse_runc_args({"--root", "create", "state", "x"}).subcommand, "state");
}

TEST(RuncArgs, MissingFlagValueIsUnreadable) {
  auto inv = parse_runc_args({"create", "--bundle"});
  EXPECT_NE(inv.unreadable.find("flag needs an argument: -bundle"), std::string::npos)
      << inv.unreadable;
  EXPECT_FALSE(parse_runc_args({"--log"}).unreadable.empty()) << "runc rejects it too";
}

TEST(RuncArgs, GlobalLogFlagsAndSystemdCgroupAreRead) {
  auto inv = parse_runc_args({"--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json",
                              "--log-format", "json", "--systemd-cgroup", "create", "--bundle",
                              "/b", "--pid-file", "/b/init.pid", "c1"});
  ASSERT_EQ(inv.unreadable, "");
  EXPECT_EQ(inv.log_path, "/b/log.json");
  EXPECT_EQ(inv.log_format, "json");
  EXPECT_TRUE(inv.systemd_cgroup);
  EXPECT_EQ(inv.container_id, "c1");
  auto eq =
      parse_runc_args({"--log=/l", "--log-format=text", "--systemd-cgroup=false", "run", "x"});
  ASSERT_EQ(eq.unreadable, "");
  EXPECT_EQ(eq.log_path, "/l");
  EXPECT_EQ(eq.log_format, "text");
  EXPECT_FALSE(eq.systemd_cgroup);
}

TEST(RuncArgs, RestoreCreatesFromTheSpecAndIsEdited) {
  auto inv = parse_runc_args({"--root", "/r", "restore", "--image-path", "/ckpt", "--work-path",
                              "/w", "--tcp-established", "--manage-cgroups-mode", "soft",
                              "--bundle", "/b", "--detach", "c9"});
  ASSERT_EQ(inv.unreadable, "");
  EXPECT_TRUE(inv.edits_spec());
  EXPECT_EQ(inv.bundle, "/b");
  EXPECT_EQ(inv.container_id, "c9");
}

namespace {

enum class Reading { bundle, refused, help, not_created };

struct Form {
  std::vector<std::string> args;
  Reading reading;
  std::string bundle;  // for Reading::bundle: absolute, or relative to the working directory
};

// Every form as Debian's runc 1.1.5+ds1 (urfave/cli 1.22.9) read it, recorded by running
//   runc --root /tmp/x <form>
// with bundles that do not exist: "chdir B: no such file or directory" names the bundle it
// used, "JSON specification file config.json not found" the working directory, "Incorrect
// Usage" or "requires exactly 1 argument(s)" a rejected command line, the command's help page
// --help. tests/scenario/runtime.sh argv-matches-runc replays such forms against the runc
// installed here.
const std::vector<Form> kRunc115Forms = {
    {{"create", "--bundle", "/b1", "id1"}, Reading::bundle, "/b1"},
    {{"create", "id1", "--bundle", "/b2"}, Reading::bundle, "/b2"},
    {{"create", "id1", "-b", "/b3"}, Reading::bundle, "/b3"},
    {{"create", "id1", "--bundle=/b4"}, Reading::bundle, "/b4"},
    {{"create", "id1", "-b=/b15"}, Reading::bundle, "/b15"},
    {{"create", "id1", "-bundle", "/b13"}, Reading::bundle, "/b13"},
    {{"create", "id1", "--bundle", "/a=b"}, Reading::bundle, "/a=b"},
    // Repeated under one name: the last wins; under both names: rejected.
    {{"create", "--bundle", "/b5a", "id1", "--bundle", "/b5b"}, Reading::bundle, "/b5b"},
    {{"create", "id1", "-b", "/b20", "--b", "/b21"}, Reading::bundle, "/b21"},
    {{"create", "--bundle", "/a", "-b", "/b", "id1"}, Reading::refused, ""},
    {{"create", "id1", "--bundle=/q9", "-b", "/q10"}, Reading::refused, ""},
    // Other flags between the id and the bundle.
    {{"create", "id1", "--pid-file", "/p", "--bundle", "/b10"}, Reading::bundle, "/b10"},
    {{"create", "id1", "--no-pivot", "--bundle", "/b11"}, Reading::bundle, "/b11"},
    {{"create", "id1", "--no-pivot=false", "--bundle", "/b12"}, Reading::bundle, "/b12"},
    {{"run", "id1", "--detach", "--bundle", "/r1"}, Reading::bundle, "/r1"},
    {{"run", "id1", "-d", "-b", "/r2"}, Reading::bundle, "/r2"},
    {{"run", "id1", "-d=true", "-b", "/q15"}, Reading::bundle, "/q15"},
    {{"restore", "id1", "--bundle", "/r3"}, Reading::bundle, "/r3"},
    // "--": ends the flags, unless it is a flag's value.
    {{"create", "--", "id1"}, Reading::bundle, ""},
    {{"create", "id1", "--"}, Reading::bundle, ""},
    {{"create", "--bundle", "/b16", "--", "id1"}, Reading::bundle, "/b16"},
    {{"create", "id1", "--bundle", "/z1", "--"}, Reading::bundle, "/z1"},
    {{"create", "id1", "--no-pivot", "--"}, Reading::bundle, ""},
    {{"create", "id1", "--bundle", "--"}, Reading::bundle, "--"},
    {{"create", "--bundle", "--", "id1", "--pid-file", "/p"}, Reading::bundle, "--"},
    {{"create", "id1", "--", "--bundle", "/b6"}, Reading::refused, ""},
    {{"create", "--", "id1", "--bundle", "/b7"}, Reading::refused, ""},
    {{"create", "--no-pivot", "--", "id1", "--bundle", "/w1"}, Reading::refused, ""},
    // A value flag takes the next argument whatever it is.
    {{"create", "id1", "--bundle", "-x"}, Reading::bundle, "-x"},
    {{"create", "id1", "--bundle", "-b"}, Reading::bundle, "-b"},
    {{"create", "id1", "--bundle", "-h"}, Reading::bundle, "-h"},
    {{"create", "--bundle=", "id1"}, Reading::bundle, ""},
    {{"create", "--bundle", "/q11", "--bundle=", "id1"}, Reading::bundle, ""},
    // Rejected by runc: the shim refuses them.
    {{"create", "id1", "extra", "--bundle", "/b8"}, Reading::refused, ""},
    {{"create", "--bundle", "/b9", "id1", "id2"}, Reading::refused, ""},
    {{"create", "id1", "--bogus"}, Reading::refused, ""},
    {{"create", "id1", "--bogus=1"}, Reading::refused, ""},
    {{"create", "id1", "--detach"}, Reading::refused, ""},  // not a flag of create
    {{"create", "id1", "--generate-bash-completion"}, Reading::refused, ""},
    {{"create", "id1", "---bundle", "/b14"}, Reading::refused, ""},
    {{"create", "----bundle", "/w2", "id1"}, Reading::refused, ""},
    {{"create", "id1", "--bundle"}, Reading::refused, ""},
    {{"create", "id1", "--no-pivot", "x"}, Reading::refused, ""},
    {{"create", "id1", "--no-pivot=maybe"}, Reading::refused, ""},
    {{"create", "id1", "-"}, Reading::refused, ""},
    {{"create", "id1", "-", "--bundle", "/w3"}, Reading::refused, ""},
    {{"create", "ID", "--bundle", "/q13", "--pid-file"}, Reading::refused, ""},
    {{"create", "ID", "--pid-file", "--bundle", "/q14"}, Reading::refused, ""},
    {{"restore", "id1", "extra"}, Reading::refused, ""},
    {{"--debug=maybe", "create", "id1"}, Reading::refused, ""},
    // Help: printed, nothing created.
    {{"create", "id1", "--help"}, Reading::help, ""},
    {{"create", "id1", "-h"}, Reading::help, ""},
    {{"create", "id1", "--h"}, Reading::help, ""},
    {{"create", "id1", "--help=false", "--bundle", "/q4"}, Reading::bundle, "/q4"},
    {{"--help", "create", "--bundle", "/q1", "id1"}, Reading::not_created, ""},
    {{"-v", "create", "--bundle", "/q2", "id1"}, Reading::not_created, ""},
    {{"--help=false", "create", "--bundle", "/q3", "id1"}, Reading::bundle, "/q3"},
    {{"--root=/tmp/x", "create", "-b", "/q12", "id1"}, Reading::bundle, "/q12"},
};

std::string join_args(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

TEST(RuncArgs, EveryFormReadAsRunc115ReadIt) {
  char cwd_buf[4096];
  ASSERT_TRUE(::getcwd(cwd_buf, sizeof cwd_buf));
  const std::string cwd = cwd_buf;
  for (const auto& form : kRunc115Forms) {
    auto inv = parse_runc_args(form.args);
    std::string what = join_args(form.args);
    switch (form.reading) {
      case Reading::bundle: {
        std::string want = form.bundle.empty()          ? cwd
                           : form.bundle.front() == '/' ? form.bundle
                                                        : cwd + "/" + form.bundle;
        EXPECT_EQ(inv.unreadable, "") << what;
        EXPECT_TRUE(inv.edits_spec()) << what;
        EXPECT_EQ(inv.bundle, want) << what;
        break;
      }
      case Reading::refused:
        EXPECT_NE(inv.unreadable, "") << what << " reads as bundle " << inv.bundle;
        break;
      case Reading::help:
        EXPECT_EQ(inv.unreadable, "") << what;
        EXPECT_TRUE(inv.help) << what;
        EXPECT_FALSE(inv.edits_spec()) << what;
        break;
      case Reading::not_created:
        EXPECT_EQ(inv.unreadable, "") << what;
        EXPECT_FALSE(inv.edits_spec()) << what;
        break;
    }
  }
}

TEST(RuncArgs, ContainerIdAfterFlagsAndReasonsNameRunc) {
  auto inv =
      parse_runc_args({"--root", "/r", "create", "ctr", "--bundle", "/b", "--pid-file", "/p"});
  EXPECT_EQ(inv.container_id, "ctr");
  EXPECT_EQ(inv.bundle, "/b");
  auto two = parse_runc_args({"create", "--bundle", "/a", "-b", "/b", "id1"});
  EXPECT_NE(two.unreadable.find("Cannot use two forms of the same flag: b bundle"),
            std::string::npos)
      << two.unreadable;
  auto extra = parse_runc_args({"create", "id1", "--bogus"});
  EXPECT_NE(extra.unreadable.find("exactly one container id"), std::string::npos)
      << extra.unreadable;
  // The log flags are read even from a line runc rejects, so the refusal reaches containerd.
  auto bad = parse_runc_args({"--log", "/l.json", "--log-format", "json", "create", "x", "y"});
  EXPECT_EQ(bad.log_path, "/l.json");
  EXPECT_NE(bad.unreadable, "");
}
