// containerd config reading, checking and `setup containerd` planning, on literal configs.
#include <gtest/gtest.h>

#include <fstream>

#include "containerd/config.hpp"
#include "containerd/setup.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

std::string fixture(const std::string& name) {
  std::ifstream in(test::source_path("tests/fixtures/containerd/" + name));
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::vector<std::string> ids(const std::vector<Finding>& findings) {
  std::vector<std::string> out;
  for (const auto& f : findings) out.push_back(f.id);
  return out;
}

// Files by path for the planner; absent = not in the map.
struct FakeFiles {
  std::map<std::string, std::string> files;
  ReadFile reader() {
    return [this](const std::string& p) -> Result<std::optional<std::string>> {
      auto it = files.find(p);
      if (it == files.end()) return std::optional<std::string>{};
      return std::optional<std::string>(it->second);
    };
  }
  void apply(const SetupPlan& plan) {
    for (const auto& c : plan.changes) files[c.path] = c.new_text;
  }
};

ContainerdConfig parse(const std::string& text) {
  return parse_containerd_config(text, "/etc/containerd/config.toml").value();
}

}  // namespace

TEST(ContainerdConfig, VersionsAndTables) {
  EXPECT_EQ(parse("").version, 1);
  EXPECT_EQ(parse("version = 2").version, 2);
  EXPECT_EQ(parse("version = 3").version, 3);
  EXPECT_EQ(runtime_table_name(1, "nvidia"), "plugins.cri.containerd.runtimes.nvidia");
  EXPECT_EQ(runtime_table_name(2, "nvidia"),
            "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia");
  EXPECT_EQ(runtime_table_name(3, "nvidia"),
            "plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia");
  auto bad = parse_containerd_config("version = 2\n[plugins\n", "/etc/containerd/config.toml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("/etc/containerd/config.toml:2:"), std::string::npos);
  EXPECT_FALSE(parse_containerd_config("version = 7", "x"));
}

TEST(ContainerdCheck, TheSeedSnippetIsWrongFourWays) {
  auto cfg = parse_containerd_config(fixture("seed-snippet.toml"), "seed.toml").value();
  auto findings = check_containerd_config(cfg, {});
  EXPECT_EQ(ids(findings),
            (std::vector<std::string>{
                "containerd.runtime-under-v1-linux", "containerd.runtime-engine-ignored",
                "containerd.unknown-runc-option", "containerd.handler-missing"}));
  EXPECT_NE(findings[2].summary.find("'Env'"), std::string::npos);
  for (const auto& f : findings) {
    EXPECT_EQ(f.severity, Severity::error);
    EXPECT_FALSE(f.fix.empty());
    EXPECT_NE(f.evidence.find("seed.toml"), std::string::npos);
  }
}

TEST(ContainerdCheck, EachCheckFiresAndStaysQuiet) {
  test::TempDir host;
  host.write("usr/local/bin/gpufence-runtime", "#!/bin/sh\n");
  std::filesystem::permissions(host / "usr/local/bin/gpufence-runtime",
                               std::filesystem::perms::owner_all);
  host.write("usr/bin/not-exec", "x");
  HostFs fs(host.path());
  ContainerdCheckOptions opt{{"nvidia"}, &fs, true};
  const std::string good = R"(version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/bin/gpufence-runtime"
    SystemdCgroup = true
)";
  EXPECT_TRUE(check_containerd_config(parse(good), opt).empty());

  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    return ids(check_containerd_config(parse(text), opt));
  };
  EXPECT_EQ(
      with("BinaryName = \"/usr/local/bin/gpufence-runtime\"", "BinaryName = \"/usr/bin/missing\""),
      (std::vector<std::string>{"containerd.binary-missing",
                                "containerd.handler-not-gpu-runtime"}));
  EXPECT_EQ(with("/usr/local/bin/gpufence-runtime", "/usr/bin/not-exec"),
            (std::vector<std::string>{"containerd.binary-missing",
                                      "containerd.handler-not-gpu-runtime"}));
  EXPECT_EQ(with("    BinaryName = \"/usr/local/bin/gpufence-runtime\"\n", ""),
            (std::vector<std::string>{"containerd.handler-plain-runc"}));
  EXPECT_EQ(with("SystemdCgroup = true", "Env = [\"A=1\"]"),
            (std::vector<std::string>{"containerd.unknown-runc-option"}));
  EXPECT_EQ(
      with("  runtime_type = \"io.containerd.runc.v2\"\n  [plugins",
           "  runtime_type = \"io.containerd.runc.v2\"\n  runtime_engine = \"/x\"\n  [plugins"),
      (std::vector<std::string>{"containerd.runtime-engine-ignored"}));
  EXPECT_EQ(with("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type "
                 "= \"io.containerd.runc.v2\"\n",
                 ""),
            (std::vector<std::string>{"containerd.default-runtime-undefined"}));
  EXPECT_EQ(ids(check_containerd_config(parse(good), {{"gpu"}, &fs, true})),
            (std::vector<std::string>{"containerd.handler-missing"}));
  // No runtimes in the file: containerd's built-in runc is the default, nothing is wrong with it.
  auto empty = ids(check_containerd_config(parse("version = 2"), {{}, nullptr, false}));
  EXPECT_TRUE(empty.empty());
}

TEST(ContainerdImports, Version2ReplacesPluginSectionsVersion3Merges) {
  std::map<std::string, std::string> files = {
      {"/etc/containerd/conf.d/a.toml",
       "version = "
       "2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\nruntime_type = "
       "\"io.containerd.runc.v2\"\n"},
      {"/etc/containerd/conf.d/b.toml",
       "version = "
       "3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\nruntime_type = "
       "\"io.containerd.runc.v2\"\n"}};
  auto read = [&](const std::string& p) -> Result<std::string> { return files.at(p); };
  auto glob_a = [](const std::string&) {
    return std::vector<std::string>{"/etc/containerd/conf.d/a.toml"};
  };
  auto glob_b = [](const std::string&) {
    return std::vector<std::string>{"/etc/containerd/conf.d/b.toml"};
  };
  auto v2 = parse(R"(version = 2
imports = ["conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
)");
  auto merged2 = merge_imports(v2, read, glob_a).value();
  auto names2 = cri_runtimes(merged2);
  ASSERT_EQ(names2.size(), 1u)
      << "containerd 1.x: the import's CRI section replaced the main one (runc is gone)";
  EXPECT_EQ(names2[0].name, "nvidia");
  EXPECT_EQ(ids(check_containerd_config(merged2, {})),
            (std::vector<std::string>{"containerd.handler-plain-runc",
                                      "containerd.default-runtime-undefined"}));
  auto v3 = parse(R"(version = 3
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
)");
  auto merged3 = merge_imports(v3, read, glob_b).value();
  EXPECT_EQ(cri_runtimes(merged3).size(), 2u) << "containerd 2.x merges";
}

TEST(ContainerdSetup, Version2AppendsToTheFileAndIsIdempotent) {
  FakeFiles fs;
  const std::string original =
      "# my comment\nversion = "
      "2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = "
      "\"io.containerd.runc.v2\"\n  "
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n    SystemdCgroup "
      "= true\n";
  fs.files["/etc/containerd/config.toml"] = original;
  SetupOptions opt;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_TRUE(text.starts_with(original)) << "the existing lines are kept as they were";
  auto cfg = parse(text);
  auto rts = cri_runtimes(cfg);
  auto nv = std::find_if(rts.begin(), rts.end(),
                         [](const RuntimeHandler& h) { return h.name == "nvidia"; });
  ASSERT_NE(nv, rts.end());
  EXPECT_EQ(nv->binary_name, "/usr/local/bin/gpufence-runtime");
  EXPECT_NE(std::find(nv->option_keys.begin(), nv->option_keys.end(), "SystemdCgroup"),
            nv->option_keys.end())
      << "runc's options are copied";
  EXPECT_NE(text.find("cdi.k8s.io/*"), std::string::npos)
      << "container_annotations lets CDI annotations through";
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty())
      << "running twice changes nothing";
}

TEST(ContainerdSetup, SetAsDefaultAndMissingRuncAndNewFile) {
  FakeFiles fs;
  SetupOptions opt;
  opt.set_as_default = true;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();  // no file yet
  ASSERT_EQ(plan.changes.size(), 1u);
  EXPECT_FALSE(plan.changes[0].existed);
  auto cfg = parse(plan.changes[0].new_text);
  EXPECT_EQ(cfg.version, 2);
  EXPECT_EQ(default_runtime_name(cfg), "nvidia");
  EXPECT_EQ(cri_runtimes(cfg).size(), 2u) << "runc is defined too, so the CRI plugin still loads";
  EXPECT_TRUE(check_containerd_config(cfg, {}).empty());
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
}

TEST(ContainerdSetup, Version1EditsTheCriTable) {
  FakeFiles fs;
  fs.files["/etc/containerd/config.toml"] =
      "[plugins.cri.containerd.runtimes.runc]\nruntime_type = \"io.containerd.runc.v2\"\n";
  auto plan = plan_containerd_setup({}, fs.reader()).value();
  auto cfg = parse(plan.changes.at(0).new_text);
  EXPECT_EQ(cfg.version, 1);
  EXPECT_NE(plan.changes[0].new_text.find("[plugins.cri.containerd.runtimes.nvidia]"),
            std::string::npos);
  EXPECT_TRUE(check_containerd_config(cfg, {}).empty());
}

TEST(ContainerdSetup, Version3WritesADropInListedInImports) {
  FakeFiles fs;
  fs.files["/etc/containerd/config.toml"] =
      "version = "
      "3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\nruntime_type = "
      "\"io.containerd.runc.v2\"\n";
  auto plan = plan_containerd_setup({}, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 2u);
  EXPECT_EQ(plan.changes[0].path, "/etc/containerd/conf.d/99-gpufence.toml");
  EXPECT_NE(plan.changes[0].new_text.find(
                "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]"),
            std::string::npos)
      << plan.changes[0].new_text;
  EXPECT_NE(plan.changes[1].new_text.find("/etc/containerd/conf.d/99-gpufence.toml"),
            std::string::npos);
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup({}, fs.reader()).value().changes.empty());
  // The merged view carries the handler.
  auto main = parse(fs.files["/etc/containerd/config.toml"]);
  auto merged =
      merge_imports(
          main, [&](const std::string& p) -> Result<std::string> { return fs.files.at(p); },
          [](const std::string& p) { return std::vector<std::string>{p}; })
          .value();
  EXPECT_TRUE(check_containerd_config(merged, {}).empty());
}

TEST(ContainerdSetup, Microk8sTemplateKeepsPlaceholders) {
  FakeFiles fs;
  SetupOptions opt;
  opt.flavor = Flavor::microk8s;
  const std::string path = default_config_path(Flavor::microk8s);
  EXPECT_FALSE(plan_containerd_setup(opt, fs.reader())) << "no microk8s: a clear error";
  fs.files[path] = fixture("microk8s-template.toml");
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_NE(text.find("default_runtime_name = \"${RUNTIME}\""), std::string::npos);
  EXPECT_NE(text.find("runtime_type = '${RUNTIME_TYPE}'"), std::string::npos)
      << "copied from runc, placeholder intact";
  EXPECT_NE(text.find("BinaryName = '/usr/local/bin/gpufence-runtime'"), std::string::npos);
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
}

TEST(ContainerdSetup, K3sTemplateBlockIsReplacedNotDuplicated) {
  FakeFiles fs;
  SetupOptions opt;
  opt.flavor = Flavor::k3s;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  EXPECT_TRUE(plan.changes[0].new_text.starts_with("{{ template \"base\" . }}"));
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
  opt.binary = "/opt/bin/gpufence-runtime";
  auto again = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(again.changes.size(), 1u);
  const auto& text = again.changes[0].new_text;
  EXPECT_EQ(text.find("/usr/local/bin/gpufence-runtime"), std::string::npos);
  EXPECT_EQ(text.find("gpufence: begin"), text.rfind("gpufence: begin")) << "one block";
}

TEST(ContainerdSetup, BrokenConfigIsRefusedAndNothingPlanned) {
  FakeFiles fs;
  fs.files["/etc/containerd/config.toml"] =
      "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\nx = 1\n";
  auto plan = plan_containerd_setup({}, fs.reader());
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().message.find("/etc/containerd/config.toml:2:"), std::string::npos);
}

TEST(ContainerdSetup, RuntimeClassManifest) {
  EXPECT_EQ(runtime_class_manifest("nvidia"),
            "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: nvidia\nhandler: "
            "nvidia\n");
}

// Found by tests/fuzz/fuzz_containerd_config.cpp: a non-ASCII code point where toml++ 3.3.0
// looks for whitespace reaches its TOML_UNREACHABLE (marzer/tomlplusplus#295, docs/fuzzing.md).
// Built as we ship it the reader still answers a parse error naming the place; this pins that.
TEST(ContainerdConfig, NonAsciiWhereTomlExpectsWhitespaceIsAParseError) {
  for (const char* name : {"crash-toml-unreachable", "crash-toml-unreachable-found"}) {
    std::ifstream in(test::source_path("tests/fuzz/corpus/containerd_config/") + name);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    ASSERT_FALSE(text.empty()) << name;
    auto cfg = parse_containerd_config(text, "/etc/containerd/config.toml");
    ASSERT_FALSE(cfg) << name;
    EXPECT_EQ(cfg.error().code, Errc::parse);
    EXPECT_NE(cfg.error().message.find("/etc/containerd/config.toml:"), std::string::npos)
        << cfg.error().message;
  }
}
