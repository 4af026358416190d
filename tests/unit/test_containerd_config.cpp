// containerd config reading, checking and `setup containerd` planning, on literal configs.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <set>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "containerd/config.hpp"
#include "containerd/setup.hpp"
#include "containerd/versions.hpp"
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
  // The doctor in a pod sees the host under a root: a host link with an absolute target leads
  // to the host's file, not this process's.
  std::filesystem::create_directories(host / "opt/gf");
  std::filesystem::copy_file(host / "usr/local/bin/gpufence-runtime", host / "opt/gf/runtime");
  std::filesystem::create_symlink("/opt/gf/runtime", host / "usr/bin/linked-runtime");
  EXPECT_EQ(with("/usr/local/bin/gpufence-runtime", "/usr/bin/linked-runtime"),
            (std::vector<std::string>{"containerd.handler-not-gpu-runtime"}));
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

// The checks are a table of {id, check}: the ids stay what tests, docs and users' scripts name,
// every finding carries one of them, and a report lists a config's findings by kind in the
// table's order, whichever runtime each comes from.
TEST(ContainerdCheck, FindingsComeFromTheTableInItsOrder) {
  const std::vector<std::string> stable = {
      "containerd.runtime-under-v1-linux",   "containerd.runtime-engine-ignored",
      "containerd.unknown-runc-option",      "containerd.handler-plain-runc",
      "containerd.binary-missing",           "containerd.handler-not-gpu-runtime",
      "containerd.handler-bypasses-binary",  "containerd.pod-annotations-cdi",
      "containerd.cdi-no-gpu-spec",          "containerd.handler-missing",
      "containerd.default-runtime-undefined"};
  EXPECT_EQ(containerd_check_ids(), stable);

  test::TempDir host;
  host.write("usr/local/bin/other-runtime", "x");  // not executable
  HostFs fs(host.path());
  // Three GPU handlers, each wrong in its own ways, listed before a v1 linux table.
  const std::string text = R"(version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "crun"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.a]
  runtime_type = "io.containerd.runc.v1"
  pod_annotations = ["cdi.k8s.io/*"]
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.a.options]
    BinaryName = "/usr/local/bin/other-runtime"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.b]
  runtime_type = "io.containerd.runc.v2"
  runtime_engine = "/usr/bin/nvidia-container-runtime"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.b.options]
    Env = ["A=1"]
[plugins."io.containerd.runtime.v1.linux".runtimes.c]
  runtime_engine = "/usr/bin/nvidia-container-runtime"
)";
  auto findings = check_containerd_config(parse(text), {{"a", "b", "gpu"}, &fs, true});
  auto found = ids(findings);
  EXPECT_EQ(std::set<std::string>(found.begin(), found.end()),
            std::set<std::string>(stable.begin(), stable.end()))
      << "every check fires on this config: " << join(found, ", ");
  auto rank = [&](const std::string& id) {
    return std::find(stable.begin(), stable.end(), id) - stable.begin();
  };
  EXPECT_TRUE(std::is_sorted(found.begin(), found.end(), [&](const auto& x, const auto& y) {
    return rank(x) < rank(y);
  })) << join(found, ", ");
  // Each names its runtime: the engine of b and of the ignored table c, both.
  std::vector<std::string> engines;
  for (const auto& f : findings)
    if (f.id == "containerd.runtime-engine-ignored") engines.push_back(f.summary.substr(0, 11));
  EXPECT_EQ(engines, (std::vector<std::string>{"runtime 'c'", "runtime 'b'"}));
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
  opt.node_agents = DefaultForNodeAgents::accept;
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
  opt.distribution = Distribution::microk8s;
  const std::string path = std::string(distribution_row(Distribution::microk8s).config_input);
  EXPECT_FALSE(plan_containerd_setup(opt, fs.reader())) << "no microk8s: a clear error";
  fs.files[path] = fixture("microk8s-template.toml");
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_NE(text.find("default_runtime_name = \"${RUNTIME}\""), std::string::npos);
  EXPECT_TRUE(text.starts_with(fixture("microk8s-template.toml")))
      << "runc's runtime_type = \"${RUNTIME_TYPE}\" and every other line stay as they were";
  auto handler = cri_runtimes(parse(text));
  auto nv = std::find_if(handler.begin(), handler.end(),
                         [](const RuntimeHandler& h) { return h.name == "nvidia"; });
  ASSERT_NE(nv, handler.end());
  EXPECT_EQ(nv->runtime_type, "io.containerd.runc.v2")
      << "the handler's shim is runc v2 whatever microk8s fills in for runc";
  EXPECT_EQ(nv->binary_name, "/usr/local/bin/gpufence-runtime");
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
}

TEST(ContainerdSetup, K3sTemplateBlockIsReplacedNotDuplicated) {
  FakeFiles fs;
  SetupOptions opt;
  opt.distribution = Distribution::k3s;
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

// ---- configs as users have them (tests/fixtures/containerd) ----

namespace {

const RuntimeHandler& handler_named(const std::vector<RuntimeHandler>& rts, std::string_view n) {
  static const RuntimeHandler none;
  auto it =
      std::find_if(rts.begin(), rts.end(), [&](const RuntimeHandler& h) { return h.name == n; });
  return it == rts.end() ? none : *it;
}

bool has(const std::vector<std::string>& v, std::string_view x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The nvidia handler's table in a planned config text.
toml::table handler_doc(const std::string& text, int version = 2,
                        std::string_view name = "nvidia") {
  auto cfg = parse(text);
  auto* t = cfg.doc["plugins"][cri_plugin_name(version)]["containerd"]["runtimes"][name].as_table();
  return t ? *t : toml::table{};
}

SetupPlan plan_for(FakeFiles& fs, const std::string& text, SetupOptions opt = {}) {
  fs.files["/etc/containerd/config.toml"] = text;
  return plan_containerd_setup(opt, fs.reader()).value();
}

}  // namespace

TEST(ContainerdRealConfigs, RuncThroughTheV1LinuxShimGivesARuncV2HandlerWithoutRuntime) {
  FakeFiles fs;
  auto plan = plan_for(fs, fixture("runc-v1-linux.toml"));
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_TRUE(text.starts_with(fixture("runc-v1-linux.toml"))) << "appended, nothing else changed";
  auto h = handler_doc(text);
  EXPECT_EQ(h["runtime_type"].value_or(std::string()), "io.containerd.runc.v2");
  EXPECT_FALSE(h.contains("runtime_root"));
  EXPECT_FALSE(h.contains("runtime_engine"));
  EXPECT_FALSE(h["options"]["Runtime"]) << "options.Runtime would replace BinaryName";
  EXPECT_FALSE(h["options"]["RuntimeRoot"]);
  EXPECT_EQ(h["options"]["SystemdCgroup"].value_or(false), true) << "the cgroup driver is kept";
  EXPECT_EQ(h["options"]["BinaryName"].value_or(std::string()), "/usr/local/bin/gpufence-runtime");
  auto findings = ids(check_containerd_config(parse(text), {{"nvidia"}, nullptr, false}));
  EXPECT_FALSE(has(findings, "containerd.handler-bypasses-binary"));
  std::string notes = join(plan.notes, "\n");
  EXPECT_NE(notes.find("options.Runtime"), std::string::npos) << notes;
}

TEST(ContainerdRealConfigs, RuncV1ShimGivesARuncV2Handler) {
  FakeFiles fs;
  auto h = handler_doc(plan_for(fs, fixture("runc-v1-shim.toml")).changes.at(0).new_text);
  EXPECT_EQ(h["runtime_type"].value_or(std::string()), "io.containerd.runc.v2");
  EXPECT_EQ(h["options"]["SystemdCgroup"].value_or(false), true);
}

TEST(ContainerdRealConfigs, OptionsComeFromTheDefaultRuntimeNotFromRunc) {
  FakeFiles fs;
  auto plan = plan_for(fs, fixture("crun-default-systemd.toml"));
  auto h = handler_doc(plan.changes.at(0).new_text);
  EXPECT_EQ(h["options"]["SystemdCgroup"].value_or(false), true)
      << "default_runtime_name = crun uses systemd; runc (not the default) does not";
  EXPECT_EQ(h["options"]["BinaryName"].value_or(std::string()), "/usr/local/bin/gpufence-runtime");
  EXPECT_NE(join(plan.notes, "\n").find("runtime 'crun'"), std::string::npos);
  // pod_annotations copied as they are (they admit nothing under cdi.k8s.io/).
  auto* pods = h["pod_annotations"].as_array();
  ASSERT_TRUE(pods);
  EXPECT_EQ(pods->size(), 1u);
}

TEST(ContainerdRealConfigs, Containerd16ConfigDefault) {
  FakeFiles fs;
  const std::string original = fixture("containerd-1.6-config-default.toml");
  SetupOptions opt;
  auto plan = plan_for(fs, original, opt);
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_TRUE(text.starts_with(original));
  auto cfg = parse(text);
  auto rts = cri_runtimes(cfg);
  const auto& nv = handler_named(rts, "nvidia");
  EXPECT_EQ(nv.runtime_type, "io.containerd.runc.v2");
  EXPECT_EQ(nv.binary_name, "/usr/local/bin/gpufence-runtime");
  EXPECT_TRUE(has(nv.option_keys, "SystemdCgroup"));
  EXPECT_TRUE(has(nv.option_keys, "Root"));
  EXPECT_EQ(nv.container_annotations, std::vector<std::string>{"cdi.k8s.io/*"});
  EXPECT_TRUE(check_containerd_config(cfg, {}).empty());
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
}

TEST(ContainerdRealConfigs, SetAsDefaultChangesOneLineAndKeepsEveryComment) {
  FakeFiles fs;
  const std::string original = fixture("microk8s-template.toml");
  SetupOptions opt;
  opt.distribution = Distribution::microk8s;
  opt.set_as_default = true;
  opt.node_agents = DefaultForNodeAgents::accept;
  fs.files[std::string(distribution_row(Distribution::microk8s).config_input)] = original;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  auto old_lines = split(original, '\n');
  auto new_lines = split(text, '\n');
  ASSERT_GE(new_lines.size(), old_lines.size());
  size_t changed = 0;
  for (size_t i = 0; i < old_lines.size(); ++i) {
    if (old_lines[i] != new_lines[i]) {
      ++changed;
      EXPECT_EQ(trim(new_lines[i]), "default_runtime_name = \"nvidia\"");
    }
  }
  EXPECT_EQ(changed, 1u) << "only default_runtime_name's line changes; the rest is appended";
  EXPECT_EQ(default_runtime_name(parse(text)), "nvidia");
  EXPECT_EQ(plan.notes.end(), std::find_if(plan.notes.begin(), plan.notes.end(), [](auto& n) {
              return n.find("re-serialised") != std::string::npos;
            }));
}

TEST(ContainerdRealConfigs, SetAsDefaultIsRefusedWithoutTheNodeAgentsFlag) {
  FakeFiles fs;
  SetupOptions opt;
  opt.set_as_default = true;
  fs.files["/etc/containerd/config.toml"] = fixture("containerd-1.6-config-default.toml");
  auto plan = plan_containerd_setup(opt, fs.reader());
  ASSERT_FALSE(plan);
  EXPECT_EQ(plan.error().code, Errc::invalid_argument);
  EXPECT_NE(plan.error().message.find("device-plugin"), std::string::npos) << "says why";
  EXPECT_NE(plan.error().message.find("--include-node-agents"), std::string::npos);
  opt.distribution = Distribution::k3s;
  EXPECT_FALSE(plan_containerd_setup(opt, fs.reader())) << "every flavor";
}

// What k0s writes as /etc/k0s/containerd.toml (pkg/component/worker/containerd): with
// containerd 1.x (k0s 1.27.1-1.35) version 2, importing the CRI config it generated, into which
// it merges CRI drop-ins; from 1.36 (containerd 2.2) version 3, importing containerd.d/*.toml.
const std::string kK0sHeader =
    "# k0s_managed=true\n# This is a placeholder configuration for k0s managed containerd.\n";
const std::string kK0sV2 =
    kK0sHeader + "imports = [\"/run/k0s/containerd-cri.toml\"]\nversion = 2\n";
const std::string kK0sCriV2 =
    "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n"
    "  default_runtime_name = \"runc\"\n"
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"
    "  runtime_type = \"io.containerd.runc.v2\"\n"
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n"
    "  SystemdCgroup = true\n";
const std::string kK0sV3 = kK0sHeader +
                           "imports = [\"/etc/k0s/containerd.d/*.toml\"]\nversion = 3\n\n"
                           "[plugins]\n  [plugins.\"io.containerd.cri.v1.images\"]\n"
                           "    [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n"
                           "      sandbox = \"quay.io/k0sproject/pause:3.10.1\"\n"
                           "  [plugins.\"io.containerd.cri.v1.runtime\"]\n";
const std::string kK0sDropIn = "/etc/k0s/containerd.d/gpufence.toml";

// k0s: one drop-in of gpufence's own in containerd.d, in the version of the containerd.toml k0s
// wrote, and that file never changes. On the old code setup refused k0s.
TEST(ContainerdSetupK0s, OneDropInInTheVersionK0sWrites) {
  struct Case {
    std::string root;
    int version;
    std::string cri;
  };
  for (const auto& c : {Case{kK0sV3, 3, "io.containerd.cri.v1.runtime"},
                        Case{kK0sV2, 2, "io.containerd.grpc.v1.cri"}}) {
    FakeFiles fs;
    fs.files["/etc/k0s/containerd.toml"] = c.root;
    fs.files["/run/k0s/containerd-cri.toml"] = kK0sCriV2;
    SetupOptions opt;
    opt.distribution = Distribution::k0s;
    opt.binary = "/usr/local/bin/gpufence-runtime";
    auto plan = plan_containerd_setup(opt, fs.reader());
    ASSERT_TRUE(plan) << plan.error().message;
    ASSERT_EQ(plan->changes.size(), 1u) << "containerd.toml is k0s's: only the drop-in";
    const auto& change = plan->changes[0];
    EXPECT_EQ(change.path, kK0sDropIn);
    EXPECT_FALSE(change.existed);
    EXPECT_EQ(change.links, LinkPolicy::refuse) << "gpufence's own file: never through a link";
    EXPECT_EQ(plan->config_path, kK0sDropIn);
    auto drop = parse_containerd_config(change.new_text, kK0sDropIn);
    ASSERT_TRUE(drop) << change.new_text;
    EXPECT_EQ(drop->version, c.version) << "k0s refuses a drop-in of another version (#7689)";
    ASSERT_TRUE(drop->doc["plugins"][c.cri].is_table()) << change.new_text;
    auto runtimes = cri_runtimes(*drop);
    ASSERT_EQ(runtimes.size(), 1u) << change.new_text;
    EXPECT_EQ(runtimes[0].name, "nvidia");
    EXPECT_EQ(runtimes[0].binary_name, "/usr/local/bin/gpufence-runtime");
    if (c.version == 2) {
      // k0s with containerd 1.x: the handler inherits the runc of the CRI config k0s generated.
      EXPECT_EQ(drop->doc["plugins"][c.cri]["containerd"]["runtimes"]["nvidia"]["options"]
                         ["SystemdCgroup"]
                             .value<bool>(),
                true)
          << change.new_text;
    } else {
      // containerd imports it by the glob k0s wrote, and finds the handler.
      fs.apply(*plan);
      auto merged = merge_imports(
          parse_containerd_config(c.root, "/etc/k0s/containerd.toml").value(),
          [&](const std::string& p) -> Result<std::string> { return fs.files.at(p); },
          [](const std::string&) { return std::vector<std::string>{kK0sDropIn}; });
      ASSERT_TRUE(merged);
      auto all = cri_runtimes(*merged);
      EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const RuntimeHandler& h) {
        return h.name == "nvidia" && h.binary_name == "/usr/local/bin/gpufence-runtime";
      }));
    }
    fs.apply(*plan);
    auto again = plan_containerd_setup(opt, fs.reader());
    ASSERT_TRUE(again);
    EXPECT_TRUE(again->changes.empty()) << "a second run changes nothing";
    EXPECT_EQ(fs.files["/etc/k0s/containerd.toml"], c.root);
  }
}

// Where k0s would not apply the drop-in, or would refuse it, nothing is planned, saying why.
TEST(ContainerdSetupK0s, RefusesWhatK0sWouldNotApply) {
  auto plan_with = [](const std::optional<std::string>& root, auto&& tweak) {
    FakeFiles fs;
    if (root) fs.files["/etc/k0s/containerd.toml"] = *root;
    SetupOptions opt;
    opt.distribution = Distribution::k0s;
    tweak(opt);
    return plan_containerd_setup(opt, fs.reader());
  };
  auto none = [](SetupOptions&) {};
  // Not k0s's any more (the marker line gone): k0s leaves containerd.d alone.
  auto user2 =
      plan_with(std::string("version = 2\nimports = [\"/etc/k0s/containerd.d/*.toml\"]\n"), none);
  ASSERT_FALSE(user2);
  EXPECT_EQ(user2.error().code, Errc::unsupported);
  EXPECT_NE(user2.error().message.find("not managed by k0s"), std::string::npos);
  // ... unless containerd itself imports and merges it (version 3).
  auto user3 =
      plan_with(std::string("# k0s_managed=false\nimports = [\"/etc/k0s/containerd.d/*.toml\"]\n"
                            "version = 3\n"),
                none);
  ASSERT_TRUE(user3) << user3.error().message;
  EXPECT_EQ(parse_containerd_config(user3->changes.at(0).new_text, kK0sDropIn)->version, 3);
  EXPECT_FALSE(plan_with(std::string("# k0s_managed=false\nversion = 3\n"), none));
  // k0s loads only containerd.d/*.toml.
  for (std::string elsewhere : {"/etc/k0s/gpufence.toml", "/etc/k0s/containerd.d/gpufence.conf",
                                "/etc/k0s/containerd.d/sub/gpufence.toml"}) {
    auto p = plan_with(kK0sV3, [&](SetupOptions& o) { o.drop_in_path = elsewhere; });
    ASSERT_FALSE(p) << elsewhere;
    EXPECT_EQ(p.error().code, Errc::invalid_argument);
  }
  // Not generated yet: its version is unknown unless the running containerd or the user says.
  auto absent = plan_with(std::nullopt, none);
  ASSERT_FALSE(absent);
  EXPECT_EQ(absent.error().code, Errc::not_found);
  auto from_node = plan_with(std::nullopt, [](SetupOptions& o) { o.node_version = 4; });
  ASSERT_TRUE(from_node) << from_node.error().message;
  EXPECT_EQ(parse_containerd_config(from_node->changes.at(0).new_text, kK0sDropIn)->version, 3)
      << "k0s 1.36 on containerd 2.x takes version 3 only";
  // A containerd.toml of the other containerd line than the one running is stale.
  auto stale = plan_with(kK0sV2, [](SetupOptions& o) { o.node_version = 3; });
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Errc::conflict);
  EXPECT_FALSE(plan_with(kK0sV3, [](SetupOptions& o) { o.version = 2; }));
  EXPECT_FALSE(plan_with(kK0sHeader + "version = 4\n", none)) << "k0s writes 2 or 3";
  // NRI's settings are not written into k0s's containerd config.
  auto nri = plan_with(kK0sV3, [](SetupOptions& o) { o.nri.enable = true; });
  ASSERT_FALSE(nri);
  EXPECT_EQ(nri.error().code, Errc::unsupported);
}

TEST(ContainerdRealConfigs, ReRunWithAnotherBinaryReplacesTheHandlerKeepingComments) {
  FakeFiles fs;
  const std::string original = fixture("containerd-1.6-config-default.toml");
  auto first = plan_for(fs, original);
  fs.apply(first);
  SetupOptions opt;
  opt.binary = "/opt/gpufence/bin/gpufence-runtime";
  auto again = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(again.changes.size(), 1u);
  const auto& text = again.changes[0].new_text;
  EXPECT_TRUE(text.starts_with(original)) << "the original lines, comment first, still lead";
  EXPECT_EQ(text.find("/usr/local/bin/gpufence-runtime"), std::string::npos);
  EXPECT_EQ(text.find("runtimes.nvidia]"), text.rfind("runtimes.nvidia]")) << "one table";
}

TEST(ContainerdRealConfigs, InheritedPodAnnotationsAdmittingCdiAreDropped) {
  FakeFiles fs;
  std::string text = fixture("crun-default-systemd.toml");
  const std::string from = "[\"io.kubernetes.cri-o.*\"]";
  text.replace(text.find(from), from.size(),
               "[\"cdi.k8s.io/*\", \"x.io/*\", 'cdi.k8s.io\\/*', \"cdi.k8s.io[/]*\", "
               "\"cdi.k8s.io[^a]*\", \"cdi*[./]*\"]");
  auto plan = plan_for(fs, text);
  auto h = handler_doc(plan.changes.at(0).new_text);
  auto* pods = h["pod_annotations"].as_array();
  ASSERT_TRUE(pods);
  ASSERT_EQ(pods->size(), 2u) << plan.changes.at(0).new_text;
  EXPECT_EQ((*pods)[0].value_or(std::string()), "x.io/*");
  EXPECT_EQ((*pods)[1].value_or(std::string()), "cdi*[./]*") << "passes no cdi.k8s.io/ key";
}

TEST(ContainerdCheck, HandlersThatBypassBinaryName) {
  auto check = [](const std::string& runtime_body) {
    auto cfg = parse(R"(version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
)" + runtime_body);
    return check_containerd_config(cfg, {{"nvidia"}, nullptr, false});
  };
  const std::string bin =
      R"([plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/local/bin/gpufence-runtime"
)";
  EXPECT_TRUE(check("  runtime_type = \"io.containerd.runc.v2\"\n" + bin).empty());
  for (std::string body : {"  runtime_type = \"io.containerd.runtime.v1.linux\"\n",
                           "  runtime_type = \"io.containerd.runc.v1\"\n",
                           "  runtime_type = \"io.containerd.kata.v2\"\n",
                           "  runtime_type = \"io.containerd.runc.v2\"\n  runtime_path = "
                           "\"/opt/shim\"\n"}) {
    auto f = check(body + bin);
    EXPECT_TRUE(has(ids(f), "containerd.handler-bypasses-binary")) << body;
  }
  auto with_runtime = check("  runtime_type = \"io.containerd.runtime.v1.linux\"\n" + bin +
                            "  Runtime = \"/usr/sbin/runc\"\n");
  ASSERT_TRUE(has(ids(with_runtime), "containerd.handler-bypasses-binary"));
  EXPECT_NE(with_runtime[0].summary.find("/usr/sbin/runc"), std::string::npos)
      << "names what runs instead";
  // A runtime that is not a GPU handler and does not run gpufence is none of our business.
  auto cfg = parse(R"(version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runtime.v1.linux"
)");
  EXPECT_FALSE(has(ids(check_containerd_config(cfg, {{}, nullptr, false})),
                   "containerd.handler-bypasses-binary"));
}

TEST(ContainerdCheck, PodAnnotationPatternsAsPathMatchSeesThem) {
  for (auto p : {"cdi.k8s.io/*", "*/*", "cdi.*/*", "cdi.k8s.io/nvidia.com_gpu", "c?i.k8s.io/x",
                 "[c]di.k8s.io/*",
                 // Forms Go's path.Match accepts that an earlier check missed.
                 "cdi.k8s.io\\/*", "cdi.k8s.io[/]*", "cdi.k8s.io[^a]*", "[a-d]di.k8s.io/x",
                 "cdi.k8s.io[!-0]*", "\\c\\d\\i.k8s.io/*", "*.io[/]?", "*[/]*"})
    EXPECT_TRUE(pod_annotation_pattern_admits_cdi(p)) << p;
  for (auto p : {"*", "cdi.k8s.io", "io.katacontainers.*", "cdi.k8s.io/", "*/*/*", "example.com/*",
                 "cdi.k8s.ioo/*", "cdi.k8s.io[^/]*", "cdi.k8s.io?*",
                 // Malformed: containerd drops Match's error, so it passes nothing.
                 "cdi.k8s.io/[", "cdi.k8s.io/\\",
                 // Leftmost commit: the class takes the '.' after "cdi", and '*' cannot cross '/'.
                 "cdi*[./]*"})
    EXPECT_FALSE(pod_annotation_pattern_admits_cdi(p)) << p;
  // The finding names a key the pattern lets through.
  EXPECT_EQ(pod_annotation_cdi_witness("cdi.k8s.io[/]*"), "cdi.k8s.io/a");
  EXPECT_EQ(pod_annotation_cdi_witness("cdi.k8s.io/nvidia.com_gpu"), "cdi.k8s.io/nvidia.com_gpu");
  auto cfg = parse(R"(version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  pod_annotations = ["io.katacontainers.*", "cdi.k8s.io/*"]
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/bin/gpufence-runtime"
)");
  auto f = check_containerd_config(cfg, {{"nvidia"}, nullptr, false});
  ASSERT_EQ(ids(f), std::vector<std::string>{"containerd.pod-annotations-cdi"});
  EXPECT_EQ(f[0].severity, Severity::error);
  EXPECT_NE(f[0].fix.find("remove \"cdi.k8s.io/*\""), std::string::npos);
  // Every such form is reported by check-containerd (and so by the doctor).
  for (std::string p : {"cdi.k8s.io\\/*", "cdi.k8s.io[/]*", "cdi.k8s.io[^a]*"}) {
    std::string text = cat(R"(version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  pod_annotations = [')",
                           p, R"(']
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/bin/gpufence-runtime"
)");
    auto found = check_containerd_config(parse(text), {{"nvidia"}, nullptr, false});
    ASSERT_EQ(ids(found), std::vector<std::string>{"containerd.pod-annotations-cdi"}) << p;
    EXPECT_NE(found[0].summary.find("e.g. \"cdi.k8s.io/"), std::string::npos) << found[0].summary;
  }
}

TEST(ContainerdCheck, CdiOnWithoutAGpuSpec) {
  test::TempDir host;
  HostFs fs(host.path());
  const std::string v2 = R"(version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
)";
  auto run = [&](const std::string& text) {
    return ids(check_containerd_config(parse(text), {{}, &fs, false}));
  };
  EXPECT_EQ(run(v2), std::vector<std::string>{"containerd.cdi-no-gpu-spec"});
  EXPECT_TRUE(run("version = 2\n").empty()) << "containerd 1.x: CDI off unless enabled";
  EXPECT_EQ(run("version = 3\n"), std::vector<std::string>{"containerd.cdi-no-gpu-spec"})
      << "containerd 2.x: on by default";
  EXPECT_TRUE(
      run("version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false\n").empty());
  // A foreign vendor's spec does not count, nor NVIDIA's kind (the plugin names its own); the
  // plugin's kind in /var/run/cdi does.
  host.write("etc/cdi/other.yaml",
             "cdiVersion: \"0.5.0\"\nkind: example.com/nic\ndevices:\n- name: a\n  "
             "containerEdits:\n    env: [\"A=1\"]\n");
  EXPECT_EQ(run(v2), std::vector<std::string>{"containerd.cdi-no-gpu-spec"});
  host.write("var/run/cdi/nvidia.yaml",
             "cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  "
             "containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n");
  EXPECT_EQ(run(v2), std::vector<std::string>{"containerd.cdi-no-gpu-spec"});
  host.write("var/run/cdi/gpufence.io-gpu.json",
             R"({"cdiVersion": "0.5.0", "kind": "gpufence.io/gpu", "devices": [{"name": "0",
                 "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]})");
  EXPECT_TRUE(run(v2).empty());
  // cdi_spec_dirs is honoured.
  EXPECT_EQ(run(v2 + "").size(), 0u);
  std::string elsewhere = v2;
  elsewhere.replace(elsewhere.find("enable_cdi = true"), 17,
                    "enable_cdi = true\n  cdi_spec_dirs = [\"/opt/cdi\"]");
  EXPECT_EQ(run(elsewhere), std::vector<std::string>{"containerd.cdi-no-gpu-spec"});
}

TEST(ContainerdSetup, Version3AddsItsImportByTextKeepingCommentsByteForByte) {
  FakeFiles fs;
  const std::string with_imports =
      "# main config, edited by hand\nversion = 3\nimports = [\n  \"/etc/containerd/other.toml\", "
      "# registry\n]\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n  "
      "runtime_type = \"io.containerd.runc.v2\" # pods\n  "
      "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n    "
      "SystemdCgroup = true\n";
  fs.files["/etc/containerd/config.toml"] = with_imports;
  auto plan = plan_containerd_setup({}, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 2u);
  std::string expected = with_imports;
  const std::string other = "\"/etc/containerd/other.toml\",";
  expected.insert(expected.find(other) + other.size(),
                  " \"/etc/containerd/conf.d/99-gpufence.toml\"");
  EXPECT_EQ(plan.changes[1].new_text, expected) << "one entry added, every other byte kept";
  EXPECT_EQ(handler_doc(plan.changes[0].new_text, 3)["options"]["SystemdCgroup"].value_or(false),
            true)
      << "the drop-in's handler inherits the main file's default runtime";

  FakeFiles fresh;
  const std::string without =
      "# no imports yet\nversion = 3 # containerd 2.1\n\n[grpc]\n  "
      "address = \"/run/containerd/containerd.sock\"\n";
  fresh.files["/etc/containerd/config.toml"] = without;
  auto p2 = plan_containerd_setup({}, fresh.reader()).value();
  EXPECT_EQ(p2.changes.at(1).new_text,
            "# no imports yet\nversion = 3 # containerd 2.1\nimports = "
            "[\"/etc/containerd/conf.d/99-gpufence.toml\"]\n\n[grpc]\n  address = "
            "\"/run/containerd/containerd.sock\"\n");
  fresh.apply(p2);
  EXPECT_TRUE(plan_containerd_setup({}, fresh.reader()).value().changes.empty());
}

TEST(ContainerdK3s, BlockCarriesAnnotationsAndK3sCgroupDriver) {
  FakeFiles fs;
  SetupOptions opt;
  opt.distribution = Distribution::k3s;
  const std::string dir = "/var/lib/rancher/k3s/agent/etc/containerd";
  fs.files[dir + "/config.toml.tmpl"] = fixture("k3s-config.toml.tmpl");
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  EXPECT_EQ(plan.changes[0].path, dir + "/config.toml.tmpl");
  const auto& text = plan.changes[0].new_text;
  EXPECT_TRUE(text.starts_with(fixture("k3s-config.toml.tmpl")));
  EXPECT_NE(text.find("container_annotations = [\"cdi.k8s.io/*\"]"), std::string::npos) << text;
  EXPECT_NE(text.find("SystemdCgroup = {{ .SystemdCgroup }}"), std::string::npos);
  EXPECT_NE(text.find("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]"),
            std::string::npos);
  EXPECT_EQ(plan.handler_name, "nvidia");
}

TEST(ContainerdK3s, Version3TemplateGetsAVersion3Block) {
  const std::string dir = "/var/lib/rancher/k3s/agent/etc/containerd";
  SetupOptions opt;
  opt.distribution = Distribution::k3s;
  {
    FakeFiles fs;  // config-v3.toml.tmpl present: k3s with containerd 2.x reads it
    fs.files[dir + "/config-v3.toml.tmpl"] = fixture("k3s-config-v3.toml.tmpl");
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_EQ(plan.changes.at(0).path, dir + "/config-v3.toml.tmpl");
    EXPECT_NE(plan.changes[0].new_text.find(
                  "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]"),
              std::string::npos);
  }
  {
    FakeFiles fs;  // no template yet, k3s last rendered version 3
    fs.files[dir + "/config.toml"] = "version = 3\n";
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_EQ(plan.changes.at(0).path, dir + "/config-v3.toml.tmpl");
    EXPECT_NE(plan.changes[0].new_text.find("io.containerd.cri.v1.runtime"), std::string::npos);
  }
  {
    FakeFiles fs;  // a base-only config.toml.tmpl under a k3s that renders version 3
    fs.files[dir + "/config.toml.tmpl"] = "{{ template \"base\" . }}\n";
    fs.files[dir + "/config.toml"] = "# rendered\nversion = 3\n";
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_NE(plan.changes.at(0).new_text.find("io.containerd.cri.v1.runtime"), std::string::npos);
  }
}

// A template whose own sections use version 3 names, though not the runtime plugin's (k3s merges
// [plugins."io.containerd.cri.v1.images"] into its version 3 base): a version 3 block, whatever
// k3s rendered last.
TEST(ContainerdK3s, ATemplateNamingTheV3ImagesPluginGetsAVersion3Block) {
  const std::string dir = "/var/lib/rancher/k3s/agent/etc/containerd";
  SetupOptions opt;
  opt.distribution = Distribution::k3s;
  FakeFiles fs;
  fs.files[dir + "/config.toml.tmpl"] =
      "{{ template \"base\" . }}\n\n[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n"
      "  sandbox = \"registry.k8s.io/pause:3.10\"\n";
  fs.files[dir + "/config.toml"] = "version = 2\n";
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  const auto& text = plan.changes.at(0).new_text;
  EXPECT_NE(text.find("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("io.containerd.grpc.v1.cri"), std::string::npos) << text;
}

TEST(ContainerdK3s, ARuntimeK3sRendersItselfIsNotDefinedTwice) {
  const std::string dir = "/var/lib/rancher/k3s/agent/etc/containerd";
  SetupOptions opt;
  opt.distribution = Distribution::k3s;
  auto block_names = [](const std::string& text) {
    auto begin = text.find("gpufence: begin");
    return text.substr(begin);
  };
  {
    FakeFiles fs;  // nvidia-container-runtime installed: k3s renders runtimes."nvidia" itself
    IsExecutable exe = [](const std::string& p) {
      return p == "/usr/bin/nvidia-container-runtime";
    };
    auto plan = plan_containerd_setup(opt, fs.reader(), exe).value();
    EXPECT_EQ(plan.handler_name, "gpufence");
    auto block = block_names(plan.changes.at(0).new_text);
    EXPECT_EQ(block.find("runtimes.nvidia"), std::string::npos);
    EXPECT_NE(block.find("runtimes.gpufence]"), std::string::npos);
    auto notes = join(plan.notes, "\n");
    EXPECT_NE(notes.find("/usr/bin/nvidia-container-runtime"), std::string::npos) << notes;
    EXPECT_NE(notes.find("handler gpufence"), std::string::npos) << notes;
  }
  {
    FakeFiles fs;  // seen in the config k3s rendered last time
    fs.files[dir + "/config.toml"] = fixture("k3s-rendered-nvidia.toml");
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_EQ(plan.handler_name, "gpufence");
    EXPECT_NE(plan.changes.at(0).new_text.find("SystemdCgroup = {{ .SystemdCgroup }}"),
              std::string::npos);
  }
  {
    FakeFiles fs;  // the user's template already defines it (the NixOS recipes do)
    fs.files[dir + "/config.toml.tmpl"] =
        "{{ template \"base\" . }}\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes."
        "nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n";
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_EQ(plan.handler_name, "gpufence");
    fs.apply(plan);
    // Our own earlier block never counts as taken: a re-run changes nothing.
    auto again = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_TRUE(again.changes.empty());
    EXPECT_EQ(again.handler_name, "gpufence");
  }
}

// ---- applying a plan: the user's file is never lost ----

namespace {

SetupPlan one_change(const std::string& path, const std::string& old_text,
                     const std::string& new_text) {
  SetupPlan plan;
  plan.changes.push_back({path, true, old_text, new_text});
  return plan;
}

std::vector<std::filesystem::path> backups_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".bak-") != std::string::npos) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(ContainerdApply, BackupsAreNeverOverwritten) {
  test::TempDir dir;
  dir.write("etc/containerd/config.toml", "first\n");
  HostFs host(dir.path());
  ASSERT_TRUE(
      apply_setup_plan(one_change("/etc/containerd/config.toml", "first\n", "second\n"), host));
  ASSERT_TRUE(
      apply_setup_plan(one_change("/etc/containerd/config.toml", "second\n", "third\n"), host));
  auto backups = backups_in(dir / "etc/containerd");
  ASSERT_EQ(backups.size(), 2u) << "two runs, two backups, even within one second";
  // Named "<config>.bak-<UTC stamp>" (common/utc_time.hpp's compact form), ".1" when taken.
  const std::regex named(R"(config\.toml\.bak-\d{8}T\d{6}Z(\.1)?)");
  for (const auto& b : backups) EXPECT_TRUE(std::regex_match(b.filename().string(), named)) << b;
  std::set<std::string> contents;
  for (const auto& b : backups) contents.insert(read_file(b).value());
  EXPECT_EQ(contents, (std::set<std::string>{"first\n", "second\n"}))
      << "the user's original is still there";
  EXPECT_EQ(read_file(dir / "etc/containerd/config.toml").value(), "third\n");
}

TEST(ContainerdApply, ASymlinkedConfigStaysASymlinkToAnUpdatedTarget) {
  test::TempDir dir;
  dir.write("opt/cfg/containerd.toml", "old\n");
  std::filesystem::create_directories(dir / "etc/containerd");
  // An absolute target, as users make them: it must resolve under --host-root.
  std::filesystem::create_symlink("/opt/cfg/containerd.toml", dir / "etc/containerd/config.toml");
  HostFs host(dir.path());
  auto backups =
      apply_setup_plan(one_change("/etc/containerd/config.toml", "old\n", "new\n"), host);
  ASSERT_TRUE(backups) << backups.error().message;
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "etc/containerd/config.toml"));
  EXPECT_EQ(read_file(dir / "opt/cfg/containerd.toml").value(), "new\n");
  ASSERT_EQ(backups->size(), 1u);
  EXPECT_TRUE((*backups)[0].starts_with("/etc/containerd/config.toml.bak-")) << (*backups)[0];
  EXPECT_EQ(read_file(dir / std::filesystem::path((*backups)[0]).relative_path()).value(), "old\n");
}

// k0s's drop-in is gpufence's own file: root never writes it through a link planted at its name
// or at its directory (a symlinked *user* config stays a link, above; this one is refused).
TEST(ContainerdApply, K0sDropInIsNeverWrittenThroughALink) {
  for (const bool link_dir : {false, true}) {
    test::TempDir dir;
    dir.write("etc/k0s/containerd.toml", kK0sV3);
    dir.write("etc/victim.toml", "the victim's bytes\n");
    std::filesystem::create_directories(dir / "opt/elsewhere");
    if (link_dir) {
      std::filesystem::create_symlink(dir / "opt/elsewhere", dir / "etc/k0s/containerd.d");
    } else {
      std::filesystem::create_directories(dir / "etc/k0s/containerd.d");
      std::filesystem::create_symlink("/etc/victim.toml",
                                      dir / "etc/k0s/containerd.d/gpufence.toml");
    }
    HostFs host(dir.path());
    SetupOptions opt;
    opt.distribution = Distribution::k0s;
    ReadFile read = [&](const std::string& p) -> Result<std::optional<std::string>> {
      auto t = host.read(p);
      if (t) return std::optional<std::string>(*t);
      if (t.error().code == Errc::not_found) return std::optional<std::string>{};
      return std::unexpected(t.error());
    };
    auto plan = plan_containerd_setup(opt, read);
    ASSERT_TRUE(plan) << plan.error().message;
    auto r = apply_setup_plan(*plan, host);
    ASSERT_FALSE(r) << (link_dir ? "directory" : "file") << " link followed";
    EXPECT_EQ(r.error().code, Errc::denied);
    EXPECT_NE(r.error().message.find("symbolic link"), std::string::npos) << r.error().message;
    EXPECT_EQ(read_file(dir / "etc/victim.toml").value(), "the victim's bytes\n");
    EXPECT_TRUE(std::filesystem::is_empty(dir / "opt/elsewhere"));
    EXPECT_TRUE(backups_in(dir / "etc").empty());
    EXPECT_EQ(read_file(dir / "etc/k0s/containerd.toml").value(), kK0sV3);
  }
  // Without a link, the same plan writes a regular file.
  test::TempDir dir;
  dir.write("etc/k0s/containerd.toml", kK0sV3);
  HostFs host(dir.path());
  SetupOptions opt;
  opt.distribution = Distribution::k0s;
  FakeFiles fs;
  fs.files["/etc/k0s/containerd.toml"] = kK0sV3;
  auto plan = plan_containerd_setup(opt, fs.reader());
  ASSERT_TRUE(plan) << plan.error().message;
  ASSERT_TRUE(apply_setup_plan(*plan, host));
  EXPECT_TRUE(std::filesystem::is_regular_file(
      std::filesystem::symlink_status(dir / "etc/k0s/containerd.d/gpufence.toml")));
  EXPECT_EQ(read_file(dir / "etc/k0s/containerd.toml").value(), kK0sV3);
}

TEST(ContainerdApply, AFileChangedSincePlanningIsLeftAlone) {
  test::TempDir dir;
  dir.write("etc/containerd/config.toml", "edited meanwhile\n");
  HostFs host(dir.path());
  auto r = apply_setup_plan(one_change("/etc/containerd/config.toml", "old\n", "new\n"), host);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::conflict);
  EXPECT_EQ(read_file(dir / "etc/containerd/config.toml").value(), "edited meanwhile\n");
  EXPECT_TRUE(backups_in(dir / "etc/containerd").empty());
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

// ---- every containerd line ----

// containerd 2.3's own `config default` (v2.3.4): version 4, the CRI tables under their version
// 3 names, judged by check-containerd like any other (04417a7: "unsupported config version 4").
TEST(ContainerdVersion4, TheDefaultOfContainerd23ParsesAndIsJudged) {
  auto cfg = parse(fixture("containerd-2.3-config-default.toml"));
  EXPECT_EQ(cfg.version, 4);
  EXPECT_EQ(cri_plugin_name(4), "io.containerd.cri.v1.runtime");
  auto rts = cri_runtimes(cfg);
  ASSERT_EQ(rts.size(), 1u);
  EXPECT_EQ(rts[0].name, "runc");
  EXPECT_EQ(ids(check_containerd_config(cfg, {{"nvidia"}, nullptr, false})),
            std::vector<std::string>{"containerd.handler-missing"});
  EXPECT_FALSE(parse_containerd_config("version = 5\n", "x"));
}

// The drop-in is the root file's version (containerd refuses a higher one) and, since the
// default's glob '/etc/containerd/conf.d/*.toml' imports it, the root file is not changed.
TEST(ContainerdVersion4, DropInOfTheRootVersionAndNoRootChangeWhenAGlobImportsIt) {
  FakeFiles fs;
  fs.files["/etc/containerd/config.toml"] = fixture("containerd-2.3-config-default.toml");
  SetupOptions opt;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  EXPECT_EQ(plan.changes[0].path, "/etc/containerd/conf.d/99-gpufence.toml");
  auto drop = parse(plan.changes[0].new_text);
  EXPECT_EQ(drop.version, 4);
  auto rts = cri_runtimes(drop);
  const auto& nv = handler_named(rts, "nvidia");
  EXPECT_EQ(nv.binary_name, "/usr/local/bin/gpufence-runtime");
  // containerd 2.1's default (version 3, no imports): a version 3 drop-in, listed in imports.
  FakeFiles v3;
  v3.files["/etc/containerd/config.toml"] = fixture("containerd-2.1-config-default.toml");
  auto plan3 = plan_containerd_setup(opt, v3.reader()).value();
  ASSERT_EQ(plan3.changes.size(), 2u);
  EXPECT_EQ(parse(plan3.changes[0].new_text).version, 3);
  EXPECT_EQ(plan3.changes[1].path, "/etc/containerd/config.toml");
}

// No version line and no default_runtime_name, the runc runtime under the CRI
// plugin's full name with SystemdCgroup = true (NVIDIA toolkit test configs): containerd's
// effective default is that runc, so the handler inherits the systemd driver.
TEST(ContainerdRealConfigs, ImplicitDefaultRuntimeOfAVersionlessFileIsInherited) {
  FakeFiles fs;
  const std::string original =
      "[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n"
      "    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"
      "      runtime_type = \"io.containerd.runc.v2\"\n"
      "      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n"
      "        SystemdCgroup = true\n";
  fs.files["/etc/containerd/config.toml"] = original;
  SetupOptions opt;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_TRUE(text.starts_with(original));
  EXPECT_EQ(text.find("plugins.cri."), std::string::npos) << text;
  auto rts = cri_runtimes(parse(text));
  const auto& nv = handler_named(rts, "nvidia");
  EXPECT_TRUE(has(nv.option_keys, "SystemdCgroup")) << text;
  EXPECT_NE(text.find("SystemdCgroup = true", text.find("runtimes.nvidia")), std::string::npos);
}

// k3s on containerd 2.x.
TEST(ContainerdK3s, WhatTheNodeRunsDecidesTheTemplateAndItsVersion) {
  const std::string dir = "/var/lib/rancher/k3s/agent/etc/containerd";
  SetupOptions opt;
  opt.distribution = Distribution::k3s;
  {
    // A base-only template and no rendered config yet: the node's containerd 2.x decides.
    FakeFiles fs;
    fs.files[dir + "/config.toml.tmpl"] = "{{ template \"base\" . }}\n";
    opt.node_version = 3;
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    EXPECT_NE(plan.changes.at(0).new_text.find("io.containerd.cri.v1.runtime"), std::string::npos);
    // Without a template at all: the v3 template is the one k3s on 2.x reads.
    FakeFiles none;
    plan = plan_containerd_setup(opt, none.reader()).value();
    EXPECT_EQ(plan.changes.at(0).path, dir + "/config-v3.toml.tmpl");
    // On containerd 1.x both present: config.toml.tmpl is the one k3s reads.
    FakeFiles both;
    both.files[dir + "/config.toml.tmpl"] = "{{ template \"base\" . }}\n";
    both.files[dir + "/config-v3.toml.tmpl"] = "{{ template \"base\" . }}\n";
    opt.node_version = 2;
    plan = plan_containerd_setup(opt, both.reader()).value();
    EXPECT_EQ(plan.changes.at(0).path, dir + "/config.toml.tmpl");
    EXPECT_NE(plan.changes.at(0).new_text.find("io.containerd.grpc.v1.cri"), std::string::npos);
  }
  {
    // The user's additions only (no base call, no version line): the rendered file has no
    // version, read as version 1 by containerd 1.x and 2.3 (measured with `config dump`): the
    // block is under plugins.cri; on 2.0-2.2, which ignore such a file's runtimes, refused.
    FakeFiles fs;
    const std::string user = "[plugins.cri.registry.mirrors.\"docker.io\"]\n  endpoint = [\"x\"]\n";
    fs.files[dir + "/config.toml.tmpl"] = user;
    opt.node_version = 4;
    auto plan = plan_containerd_setup(opt, fs.reader()).value();
    const auto& text = plan.changes.at(0).new_text;
    EXPECT_TRUE(text.starts_with(user));
    EXPECT_NE(text.find("[plugins.cri.containerd.runtimes.nvidia]"), std::string::npos) << text;
    opt.node_version = 3;
    auto refused = plan_containerd_setup(opt, fs.reader());
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("version = 3"), std::string::npos);
  }
}

// ---- NRI's table (install --enforcement nri|both) ----

TEST(ContainerdNri, SettingsFollowEachLinesDefaultAndTheFile) {
  // 1.7 (version 2): off unless the file says disable = false; 2.x: on unless it says true.
  EXPECT_FALSE(nri_settings(parse("version = 2\n")).enabled);
  EXPECT_TRUE(nri_settings(parse("version = 2\n"), 2).enabled) << "2.x reading a version-2 file";
  EXPECT_TRUE(nri_settings(parse("version = 3\n")).enabled);
  auto off =
      nri_settings(parse("version = 3\n[plugins.'io.containerd.nri.v1.nri']\n"
                         "disable = true\nsocket_path = '/run/x/nri.sock'\n"));
  EXPECT_FALSE(off.enabled);
  EXPECT_TRUE(off.explicitly_set);
  EXPECT_EQ(off.socket_path, "/run/x/nri.sock");
  EXPECT_EQ(nri_settings(parse("version = 2\n")).socket_path, "/var/run/nri/nri.sock");
  auto req = nri_settings(parse(
      "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\nenable = true\n"
      "required_plugins = ['a', 'gpufence-nri']\ntolerate_missing_plugins_annotation = 'k'\n"));
  EXPECT_TRUE(req.validator_enabled);
  EXPECT_EQ(req.required_plugins, (std::vector<std::string>{"a", "gpufence-nri"}));
  EXPECT_EQ(req.tolerate_annotation, "k");
}

// NRI without the handler, line by line in a version-2 file: the user's text kept, no runtime
// added, idempotent.
TEST(ContainerdNri, SetupPlansNriAloneInPlaceAndIsIdempotent) {
  FakeFiles fs;
  const std::string original =
      "# mine\nversion = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"
      "  socket_path = \"/var/run/nri/nri.sock\"\n";
  fs.files["/etc/containerd/config.toml"] = original;
  SetupOptions opt;
  opt.handler = HandlerEdit::skip;
  opt.nri.enable = true;
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_EQ(text,
            "# mine\nversion = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"
            "  socket_path = \"/var/run/nri/nri.sock\"\n")
      << "one value changed, nothing else";
  EXPECT_TRUE(cri_runtimes(parse(text)).empty());
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
  // required_plugins on top (containerd >= 2.2 reading a version-2 file): the decider and the
  // fence, and no waiver unless one is asked for.
  opt.nri.required_plugins = {"gpufence-nri", "gpufence-fence"};
  auto plan2 = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan2.changes.size(), 1u);
  auto s = nri_settings(parse(plan2.changes[0].new_text));
  EXPECT_TRUE(s.validator_enabled);
  EXPECT_EQ(s.required_plugins, (std::vector<std::string>{"gpufence-nri", "gpufence-fence"}));
  EXPECT_EQ(s.tolerate_annotation, "");
  EXPECT_TRUE(plan2.changes[0].new_text.starts_with("# mine\n")) << "edited line by line";
}

// A waiver key an earlier install wrote into a version-2 file (line by line) is taken out by
// the next plan, its line alone; the user's own other keys stay; the plan after that is empty.
// One the install did not write (earlier_tolerate_annotation names another) stays.
TEST(ContainerdNri, AnEarlierInstallsWaiverIsTakenOut) {
  FakeFiles fs;
  const std::string with_waiver =
      "# mine\nversion = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"
      "  [plugins.\"io.containerd.nri.v1.nri\".default_validator]\n    enable = true\n"
      "    required_plugins = [\"gpufence-nri\"]\n"
      "    tolerate_missing_plugins_annotation = \"gpufence.io/tolerate-missing-nri\"\n"
      "    reject_oci_hook_adjustment = false\n";
  fs.files["/etc/containerd/config.toml"] = with_waiver;
  SetupOptions opt;
  opt.handler = HandlerEdit::skip;
  opt.nri.enable = true;
  opt.nri.required_plugins = {"gpufence-nri", "gpufence-fence"};
  opt.nri.earlier_tolerate_annotation = "someone-else";
  auto kept = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(kept.changes.size(), 1u);
  EXPECT_EQ(nri_settings(parse(kept.changes[0].new_text)).tolerate_annotation,
            "gpufence.io/tolerate-missing-nri")
      << "a key no install of ours wrote is the user's";
  opt.nri.earlier_tolerate_annotation = "gpufence.io/tolerate-missing-nri";
  auto plan = plan_containerd_setup(opt, fs.reader()).value();
  ASSERT_EQ(plan.changes.size(), 1u);
  const auto& text = plan.changes[0].new_text;
  EXPECT_EQ(text,
            "# mine\nversion = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"
            "  [plugins.\"io.containerd.nri.v1.nri\".default_validator]\n    enable = true\n"
            "    required_plugins = [\"gpufence-nri\", \"gpufence-fence\"]\n"
            "    reject_oci_hook_adjustment = false\n")
      << "the waiver's line out, the fence in, nothing else";
  fs.apply(plan);
  EXPECT_TRUE(plan_containerd_setup(opt, fs.reader()).value().changes.empty());
}

TEST(ContainerdNri, Version1AndK3sAreRefusedForNri) {
  FakeFiles fs;
  fs.files["/etc/containerd/config.toml"] = "[plugins.cri]\n";
  SetupOptions opt;
  opt.nri.enable = true;
  auto v1 = plan_containerd_setup(opt, fs.reader());
  ASSERT_FALSE(v1);
  EXPECT_NE(v1.error().message.find("version 1"), std::string::npos) << v1.error().message;
  opt.distribution = Distribution::k3s;
  EXPECT_FALSE(plan_containerd_setup(opt, fs.reader()));
}

// The per-version row table (containerd/versions.hpp) is what docs/containerd-lines.md and
// docs/install.md say of each config version, and its readers answer from it.
TEST(ContainerdVersions, EachRowIsWhatTheDocsSay) {
  ASSERT_EQ(config_version_table().size(), static_cast<size_t>(kMaxConfigVersion));
  struct Documented {
    int version;
    std::string cri;
    bool cdi, nri;
    HandlerPlacement placement;
  };
  for (const auto& d : std::vector<Documented>{
           {1, "cri", false, false, HandlerPlacement::in_place},
           {2, "io.containerd.grpc.v1.cri", false, false, HandlerPlacement::in_place},
           {3, "io.containerd.cri.v1.runtime", true, true, HandlerPlacement::drop_in},
           {4, "io.containerd.cri.v1.runtime", true, true, HandlerPlacement::drop_in}}) {
    const auto& row = config_version_row(d.version);
    EXPECT_EQ(row.version, d.version);
    EXPECT_EQ(row.cri_plugin, d.cri) << d.version;
    EXPECT_EQ(cri_plugin_name(d.version), d.cri) << d.version;
    EXPECT_EQ(row.cdi_by_default, d.cdi) << d.version;
    EXPECT_EQ(row.nri_by_default, d.nri) << d.version;
    EXPECT_EQ(row.placement, d.placement) << d.version;
    ContainerdConfig cfg;
    cfg.version = d.version;
    EXPECT_EQ(cdi_settings(cfg).enabled, d.cdi) << d.version;
    EXPECT_EQ(nri_settings(cfg).enabled, d.nri) << d.version;
  }
  // `containerd config default` of each line (measured: 1.6.20, 1.7.24, 2.1.9, 2.3.4).
  EXPECT_EQ(config_version_of_release("1.6.20~ds1"), 2);
  EXPECT_EQ(config_version_of_release("v1.7.24"), 2);
  EXPECT_EQ(config_version_of_release("v2.0.4-k3s2"), 3);
  EXPECT_EQ(config_version_of_release("2.1.9+ds1"), 3);
  EXPECT_EQ(config_version_of_release("v2.2.0"), 3);
  EXPECT_EQ(config_version_of_release("v2.3.4"), 4);
  EXPECT_EQ(config_version_of_release("v0.9.1"), 2);
  EXPECT_EQ(config_version_of_release("garbage"), std::nullopt);
}

// Imports and k0s's drop-ins are expanded as Go's filepath.Glob does: '*' matches a leading dot
// (".toml" is loaded by containerd and k0s; glob(3), which the doctor used before, skipped it and
// judged a config without that file), names come sorted bytewise, meta characters in a directory
// are globbed too, a path without '*' names itself only when it exists, and a malformed pattern
// matches nothing.
TEST(GoGlob, MatchesAsContainerdAndK0sExpandAnImport) {
  test::TempDir d;
  for (const char* f : {"etc/d/.toml", "etc/d/a.toml", "etc/d/B.toml", "etc/d/c.yml",
                        "etc/d/sub/x.toml", "etc/e/x.toml", "etc/d/.hidden/x.toml"})
    d.write(f, "version = 3\n");
  const HostFs host(d.path());
  EXPECT_EQ(go_glob(host, "/etc/d/*.toml"),
            (std::vector<std::string>{"/etc/d/.toml", "/etc/d/B.toml", "/etc/d/a.toml"}));
  EXPECT_EQ(go_glob(host, "/etc/*/x.toml"), (std::vector<std::string>{"/etc/e/x.toml"}));
  EXPECT_EQ(go_glob(host, "/etc/d/*/x.toml"),
            (std::vector<std::string>{"/etc/d/.hidden/x.toml", "/etc/d/sub/x.toml"}));
  EXPECT_EQ(go_glob(host, "/etc/d/a.toml"), (std::vector<std::string>{"/etc/d/a.toml"}));
  EXPECT_TRUE(go_glob(host, "/etc/d/missing.toml").empty());
  EXPECT_TRUE(go_glob(host, "/etc/d/[*.toml").empty()) << "ErrBadPattern";
  EXPECT_TRUE(go_glob(host, "/etc/missing/*.toml").empty());

  // The doctor's view: a handler defined only in ".toml" is seen through the import.
  d.write("etc/containerd/config.toml", "version = 3\nimports = [\"/etc/d/*.toml\"]\n");
  d.write("etc/d/.toml",
          "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.hidden]\n"
          "  runtime_type = \"io.containerd.runc.v2\"\n");
  auto main = parse_containerd_config(read_file(d / "etc/containerd/config.toml").value(),
                                      "/etc/containerd/config.toml");
  ASSERT_TRUE(main);
  auto merged = merge_imports_from_host(*main, host);
  ASSERT_TRUE(merged) << merged.error().message;
  bool seen = false;
  for (const auto& h : cri_runtimes(*merged)) seen |= h.name == "hidden";
  EXPECT_TRUE(seen);
}
