// gpufence install / uninstall on fake host roots, one per distribution with its config laid out
// as that distribution ships it, against a fake containerd that loads its config only when
// restarted (so a handler the file has but containerd never re-read is caught).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/file.hpp"
#include "containerd/config.hpp"
#include "containerd/setup.hpp"
#include "install/install.hpp"
#include "install/state.hpp"
#include "runtime/config.hpp"
#include "support/test_support.hpp"

namespace gpufence {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

ProcessResult exited(int code, std::string out) {
  ProcessResult r;
  r.exit_code = code;
  r.out = std::move(out);
  return r;
}

// A containerd that reads `config` (a real path) when restarted and answers CRI with what it
// read. k3s/rke2 templates: the `{{ template "base" . }}` line stands for k3s's own config, and
// `{{ .SystemdCgroup }}` is rendered as k3s renders it.
class FakeContainerd final : public ProcessRunner, public RuntimeProbe {
 public:
  // `host`: where the config's imports (host paths) are read, as containerd merges them.
  explicit FakeContainerd(fs::path config, const HostFs* host = nullptr)
      : m_config(std::move(config)), m_host(host) {
    load();
  }

  std::vector<std::vector<std::string>> commands;     // restarts
  std::vector<std::vector<std::string>> smoke_tests;  // gpufence-runtime --gpufence-help
  bool binary_runs = true;                            // the host can run the copied shim
  bool nri_runs = true;                               // the host can run gpufence-nri --help
  std::vector<std::vector<std::string>> nri_smoke_tests;
  bool restart_fails = false;   // the restart command exits 1
  bool comes_back = true;       // after a restart, it answers again
  bool ignores_config = false;  // comes back with only runc (reads some other file)
  std::string release;          // CRI Version's runtime_version ("" = no answer)
  // What the distribution does when restarted, before containerd reads its config (k0s
  // regenerates the files containerd reads).
  std::function<void()> on_restart;

  Result<std::string> runtime_version(const std::string& socket,
                                      std::chrono::milliseconds) override {
    if (release.empty() || !m_up) return fail(Errc::rpc, "connect ", socket, ": refused");
    return release;
  }
  // What a containerd restarted by a process that was then killed has loaded.
  void reload() {
    m_up = true;
    load();
  }

  Result<ProcessResult> run(const std::vector<std::string>& argv) override {
    if (argv.back() == "--gpufence-help") {  // install's check that the copied shim starts
      smoke_tests.push_back(argv);
      if (binary_runs) return exited(0, "gpufence-runtime: usage");
      return exited(1,
                    "/usr/local/bin/gpufence-runtime: /lib/x86_64-linux-gnu/libc.so.6: "
                    "version `GLIBC_2.36' not found");
    }
    if (argv.back() == "--help") {  // install's check that the copied gpufence-nri starts
      nri_smoke_tests.push_back(argv);
      return nri_runs ? exited(0, "gpufence-nri: usage")
                      : exited(1, "gpufence-nri: GLIBC_2.36 not found");
    }
    commands.push_back(argv);
    if (restart_fails) return exited(1, "Job for containerd.service failed.");
    if (on_restart) on_restart();
    m_up = comes_back;
    load();
    return exited(0, "");
  }

  Result<std::vector<LoadedRuntime>> loaded_runtimes(const std::string& socket,
                                                     std::chrono::milliseconds) override {
    sockets.push_back(socket);
    if (!m_up) return fail(Errc::rpc, "connect ", socket, ": connection refused");
    return m_loaded;
  }
  std::vector<std::string> sockets;

  // containerd listens on NRI's socket when the config it loaded (imports merged) enables NRI,
  // with the defaults of its release: off on 1.x, on from 2.0.
  bool nri_listening(const std::string& path) override {
    // Where the path leads while the caller holds it open (a /proc/self/fd/N/NAME path).
    std::error_code ec;
    auto dir = fs::canonical(fs::path(path).parent_path(), ec);
    nri_sockets.push_back(ec ? path : (dir / fs::path(path).filename()).string());
    return m_up && m_nri;
  }
  std::vector<std::string> nri_sockets;
  // The NRI settings the config it loaded has.
  NriSettings nri;

 private:
  void load() {
    m_loaded = {{"runc", "io.containerd.runc.v2", std::nullopt, "", {}}};
    std::optional<int> major;
    if (!release.empty()) major = release.starts_with("v2") || release.starts_with("2") ? 2 : 1;
    nri = nri_settings(ContainerdConfig{}, major);
    m_nri = nri.enabled;
    if (ignores_config) return;
    auto text = read_file(m_config);
    if (!text) return;
    std::string body;
    for (std::string_view line : std::vector<std::string_view>{*text}) body = line;
    if (auto pos = body.find("{{"); pos != std::string::npos) {
      auto end = body.find('\n', pos);
      // k3s's base template: version 3 for containerd 2.x (config-v3.toml.tmpl), else 2.
      bool v3 = m_config.filename().string().find("config-v3") != std::string::npos;
      body = (v3 ? "version = 3\n" : "version = 2\n") +
             body.substr(end == std::string::npos ? body.size() : end + 1);
    }
    // k3s fills in the template's variables when it renders it (docs/containerd-setup.md).
    for (std::string var = "{{ .SystemdCgroup }}"; body.find(var) != std::string::npos;)
      body.replace(body.find(var), var.size(), "true");
    auto cfg = parse_containerd_config(body, m_config.string());
    if (!cfg) return;
    if (m_host) {
      cfg = merge_imports_from_host(*cfg, *m_host);
      if (!cfg) return;
    }
    nri = nri_settings(*cfg, major);
    m_nri = nri.enabled;
    m_loaded.clear();
    for (const auto& h : cri_runtimes(*cfg))
      m_loaded.push_back(
          {h.name, h.runtime_type, h.binary_name, h.runtime_path, h.pod_annotations});
    if (std::none_of(m_loaded.begin(), m_loaded.end(),
                     [](const LoadedRuntime& l) { return l.name == "runc"; }))
      m_loaded.push_back({"runc", "io.containerd.runc.v2", std::nullopt, "", {}});
  }
  fs::path m_config;
  const HostFs* m_host;
  bool m_up = true;
  bool m_nri = false;
  std::vector<LoadedRuntime> m_loaded;
};

std::string slurp(const fs::path& p) {
  return read_file(p).value_or("<absent>");
}

// Every file under a tree with its bytes: a second install must leave this identical.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_symlink())
      out[e.path().string()] = "-> " + fs::read_symlink(e.path()).string();
    else if (e.is_regular_file())
      out[e.path().string()] = slurp(e.path());
  }
  return out;
}

struct Node {
  TempDir dir;
  fs::path host = dir / "host";
  fs::path runtime_source, nri_source;
  HostFs fs_{host};
  std::optional<FakeContainerd> containerd;
  std::chrono::steady_clock::time_point clock{};

  Node() {
    fs::create_directories(host);
    // As on Debian and Ubuntu: /var/run is an absolute link to /run, where containerd makes
    // NRI's socket directory. Under a host root that link must be followed inside the root.
    fs::create_directories(host / "run/nri");
    fs::create_directories(host / "var");
    fs::create_symlink("/run", host / "var/run");
    runtime_source = dir.write("build/gpufence-runtime", std::string("\x7f"
                                                                     "ELF fake runtime",
                                                                     20));
    nri_source = dir.write("build/gpufence-nri", std::string("\x7f"
                                                             "ELF fake nri",
                                                             16));
  }
  void start_containerd(const std::string& config_host_path) {
    containerd.emplace(fs_.resolve(config_host_path), &fs_);
  }
  InstallOptions options(std::optional<Distribution> d = std::nullopt) {
    InstallOptions o;
    o.distribution = d;
    o.binary.source = runtime_source.string();
    o.nri_binary.source = nri_source.string();
    o.ready_timeout = std::chrono::milliseconds(1000);
    // The handler's tests; the NRI ones (InstallEnforcement) ask for their mode.
    o.enforcement = EnforcementRequest::runtime;
    return o;
  }
  InstallEnv env() {
    return InstallEnv{fs_,
                      *containerd,
                      *containerd,
                      [](const std::string& hook) -> Result<std::string> {
                        return "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n# hook " + hook + "\n";
                      },
                      [this](std::chrono::milliseconds d) { clock += d; },
                      [this] { return clock; }};
  }
};

const std::string kPlainConfig =
    "# the user's own file\nversion = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n"
    "  sandbox_image = \"registry.example/pause:3.9\"\n"
    "  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"
    "    runtime_type = \"io.containerd.runc.v2\"\n"
    "    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n"
    "      SystemdCgroup = true\n";

TEST(InstallLayout, DetectsEachDistributionFromItsFiles) {
  struct Case {
    std::string marker;
    Distribution want;
  };
  for (const auto& c : std::vector<Case>{
           {"var/snap/microk8s/current/args/containerd-template.toml", Distribution::microk8s},
           {"var/lib/rancher/k3s/agent/etc/containerd/config.toml", Distribution::k3s},
           {"var/lib/rancher/rke2/agent/etc/containerd/config.toml", Distribution::rke2},
           {"etc/containerd/config.toml", Distribution::containerd}}) {
    TempDir d;
    d.write(c.marker, "");
    std::vector<std::string> notes;
    auto got = detect_distribution(HostFs(d.path()), notes);
    ASSERT_TRUE(got) << c.marker;
    EXPECT_EQ(*got, c.want) << c.marker;
  }
}

TEST(InstallLayout, PrefersTheKubernetesDistributionOverADockerContainerd) {
  TempDir d;
  d.write("etc/containerd/config.toml", "");  // Docker's containerd, no kubelet behind it
  d.write("var/snap/microk8s/current/args/containerd-template.toml", "");
  std::vector<std::string> notes;
  auto got = detect_distribution(HostFs(d.path()), notes);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, Distribution::microk8s);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[1].find("also found /etc/containerd (containerd)"), std::string::npos);
}

TEST(InstallLayout, NothingFoundNamesWhatWasLookedFor) {
  TempDir d;
  std::vector<std::string> notes;
  auto got = detect_distribution(HostFs(d.path()), notes);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("/var/snap/microk8s/current/args"), std::string::npos);
  EXPECT_NE(got.error().message.find("--distribution"), std::string::npos);
}

TEST(InstallLayout, PathsAndRestartPerDistribution) {
  TempDir d;
  HostFs host(d.path());
  auto mk = layout_for(Distribution::microk8s, host);
  EXPECT_EQ(mk.config_path, "/var/snap/microk8s/current/args/containerd-template.toml");
  EXPECT_EQ(mk.socket, "/var/snap/microk8s/common/run/containerd.sock");
  EXPECT_EQ(mk.restart,
            (std::vector<std::string>{"snap", "restart", "microk8s.daemon-containerd"}));
  EXPECT_EQ(mk.kubelet_dir, "/var/snap/microk8s/common/var/lib/kubelet");
  auto k3s = layout_for(Distribution::k3s, host);
  EXPECT_EQ(k3s.config_path, "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl");
  EXPECT_EQ(k3s.socket, "/run/k3s/containerd/containerd.sock");
  EXPECT_EQ(k3s.restart, (std::vector<std::string>{"systemctl", "restart", "k3s"}));
  d.write("etc/systemd/system/k3s-agent.service", "");
  EXPECT_EQ(layout_for(Distribution::k3s, host).restart.back(), "k3s-agent");
  d.write("usr/local/lib/systemd/system/rke2-agent.service", "");
  auto rke2 = layout_for(Distribution::rke2, host);
  EXPECT_EQ(rke2.restart.back(), "rke2-agent");
  EXPECT_EQ(rke2.config_path, "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl");
  EXPECT_EQ(layout_for(Distribution::containerd, host).restart,
            (std::vector<std::string>{"systemctl", "restart", "containerd"}));
}

// k0s (pkg/component/worker/containerd): containerd.toml is k0s's, rewritten at every start.
// From 1.36 (containerd 2.2) version 3 importing containerd.d/*.toml; with containerd 1.x
// version 2 importing /run/k0s/containerd-cri.toml, the CRI config k0s generates and merges CRI
// drop-ins into.
const std::string kK0sHeader =
    "# k0s_managed=true\n# This is a placeholder configuration for k0s managed containerd.\n";
const std::string kK0sV3 = kK0sHeader +
                           "imports = [\"/etc/k0s/containerd.d/*.toml\"]\nversion = 3\n\n"
                           "[plugins]\n  [plugins.\"io.containerd.cri.v1.images\"]\n"
                           "    [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n"
                           "      sandbox = \"quay.io/k0sproject/pause:3.10.1\"\n"
                           "  [plugins.\"io.containerd.cri.v1.runtime\"]\n";
const std::string kK0sV2 =
    kK0sHeader + "imports = [\"/run/k0s/containerd-cri.toml\"]\nversion = 2\n";
const std::string kK0sCriDefaults =
    "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n"
    "  default_runtime_name = \"runc\"\n"
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"
    "  runtime_type = \"io.containerd.runc.v2\"\n";

// A k0s node: containerd.toml as k0s writes it, containerd.d (k0s makes it at start), the
// worker unit, and a containerd of the release k0s ships.
void lay_out_k0s(Node& n, const std::string& root, const std::string& release) {
  n.dir.write("host/etc/k0s/containerd.toml", root);
  fs::create_directories(n.host / "etc/k0s/containerd.d");
  n.dir.write("host/etc/systemd/system/k0sworker.service", "");
  n.start_containerd("/etc/k0s/containerd.toml");
  n.containerd->release = release;
}

// k0s with containerd 1.x at its restart: the CRI drop-ins in containerd.d merged into the CRI
// config it generates (configurer.go handleImports, an RFC 7396 merge patch), which
// containerd.toml imports.
void merge_into(toml::table& dst, const toml::table& src) {
  for (const auto& [k, v] : src) {
    auto* sub = dst.get_as<toml::table>(k.str());
    if (sub && v.is_table())
      merge_into(*sub, *v.as_table());
    else
      dst.insert_or_assign(k.str(), v);
  }
}
void k0s_regenerates_cri_config(const fs::path& host) {
  toml::table cri = toml::parse(kK0sCriDefaults);
  std::vector<fs::path> drop_ins;
  for (const auto& e : fs::directory_iterator(host / "etc/k0s/containerd.d"))
    if (e.path().extension() == ".toml") drop_ins.push_back(e.path());
  std::sort(drop_ins.begin(), drop_ins.end());
  for (const auto& p : drop_ins) {
    toml::table t = toml::parse(read_file(p).value());
    if (t["plugins"]["io.containerd.grpc.v1.cri"].is_table()) merge_into(cri, t);
  }
  std::ostringstream out;
  out << cri;
  fs::create_directories(host / "run/k0s");
  write_file_atomic(host / "run/k0s/containerd-cri.toml", out.str()).value();
}

// On k0s, install writes its own drop-in, containerd.d/gpufence.toml, in the version of the
// containerd.toml k0s wrote, leaves that file byte for byte, restarts k0s's unit, and verifies the
// running containerd; uninstall takes exactly that back. On the old code install refused k0s.
TEST(InstallK0s, WritesItsDropInLeavesContainerdTomlAndUninstallTakesItBack) {
  struct Case {
    std::string root, release;
    int version;
  };
  for (const auto& c : {Case{kK0sV3, "v2.2.1", 3}, Case{kK0sV2, "v1.7.27", 2}}) {
    Node n;
    lay_out_k0s(n, c.root, c.release);
    if (c.version == 2) {
      k0s_regenerates_cri_config(n.host);
      n.containerd->on_restart = [&n] { k0s_regenerates_cri_config(n.host); };
      n.containerd->reload();
    }
    const auto before = snapshot(n.host);
    auto report = run_install(n.options(), n.env());
    ASSERT_TRUE(report.ok()) << render_install_report(report);
    EXPECT_EQ(report.distribution, "k0s");
    const fs::path drop_in = n.host / "etc/k0s/containerd.d/gpufence.toml";
    ASSERT_TRUE(fs::is_regular_file(fs::symlink_status(drop_in)));
    auto drop = parse_containerd_config(slurp(drop_in), "gpufence.toml");
    ASSERT_TRUE(drop) << slurp(drop_in);
    EXPECT_EQ(drop->version, c.version);
    EXPECT_EQ(slurp(n.host / "etc/k0s/containerd.toml"), c.root) << "k0s's file, byte for byte";
    ASSERT_EQ(n.containerd->commands.size(), 1u);
    EXPECT_EQ(n.containerd->commands[0],
              (std::vector<std::string>{"systemctl", "restart", "k0sworker"}));
    EXPECT_EQ(report.steps.back().name, "verify");
    EXPECT_EQ(report.steps.back().outcome, Outcome::unchanged) << report.steps.back().detail;

    auto again = run_install(n.options(), n.env());
    ASSERT_TRUE(again.ok()) << render_install_report(again);
    EXPECT_FALSE(again.changed_anything()) << render_install_report(again);

    auto un = run_uninstall(n.options(), n.env());
    ASSERT_TRUE(un.ok()) << render_install_report(un);
    EXPECT_FALSE(fs::exists(fs::symlink_status(drop_in)));
    auto after = snapshot(n.host);
    if (c.version == 2) {
      // k0s regenerated its CRI config at the restarts: its own file, as before.
      EXPECT_EQ(after.at((n.host / "run/k0s/containerd-cri.toml").string()),
                before.at((n.host / "run/k0s/containerd-cri.toml").string()));
    }
    EXPECT_EQ(after, before) << "uninstall removes exactly what install added";
  }
}

// root must not write through a link planted at gpufence's drop-in or at containerd.d: install
// refuses before anything on the host changes, and the link's target keeps its bytes.
TEST(InstallK0s, ALinkAtTheDropInOrItsDirectoryIsNotFollowed) {
  for (const bool link_dir : {false, true}) {
    Node n;
    n.dir.write("host/etc/k0s/containerd.toml", kK0sV3);
    n.dir.write("host/etc/victim.toml", "the victim's bytes\n");
    fs::create_directories(n.host / "opt/elsewhere");
    if (link_dir) {
      fs::create_symlink("/opt/elsewhere", n.host / "etc/k0s/containerd.d");
    } else {
      fs::create_directories(n.host / "etc/k0s/containerd.d");
      fs::create_symlink("/etc/victim.toml", n.host / "etc/k0s/containerd.d/gpufence.toml");
    }
    n.start_containerd("/etc/k0s/containerd.toml");
    n.containerd->release = "v2.2.1";
    const auto before = snapshot(n.host);
    auto report = run_install(n.options(Distribution::k0s), n.env());
    ASSERT_FALSE(report.ok()) << (link_dir ? "directory" : "file") << " link followed";
    EXPECT_NE(report.failure->find("symbolic link"), std::string::npos) << *report.failure;
    EXPECT_FALSE(report.changed_anything());
    EXPECT_TRUE(n.containerd->commands.empty());
    EXPECT_EQ(snapshot(n.host), before) << "nothing on the host changed";
    EXPECT_EQ(slurp(n.host / "etc/victim.toml"), "the victim's bytes\n");
    EXPECT_TRUE(fs::is_empty(n.host / "opt/elsewhere"));
  }
}

// k0s and containerd merge every containerd.d/*.toml into one CRI table, in name order: another
// drop-in defining the same runtime (the GPU Operator's nvidia.toml) would win the merge after
// gpufence.toml, or leave its keys (a runtime_path) in the handler before it. Refused before
// anything changes; another --runtime-name installs. Also found: a file named ".toml" (Go's
// filepath.Glob, which k0s and containerd use, matches dot-files; glob(3) does not) and a file
// that declares no version, or version 2, around a version-3 table (containerd 2.x migrates it
// before the merge). On the old code both passed, and containerd's `config dump` showed the
// other file's pod_annotations in gpufence's handler.
TEST(InstallK0s, AnotherDropInDefiningTheSameRuntimeIsRefused) {
  const std::string v3_tables =
      "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\n"
      "  runtime_type = \"io.containerd.runc.v2\"\n"
      "  runtime_path = \"/opt/other/containerd-shim\"\n"
      "  pod_annotations = [\"cdi.k8s.io/*\"]\n"
      "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia.options]\n"
      "  BinaryName = \"/usr/local/nvidia/toolkit/nvidia-container-runtime\"\n";
  const std::pair<std::string, std::string> others[] = {
      {"nvidia.toml", "version = 3\n" + v3_tables}, {"00-shim.toml", "version = 3\n" + v3_tables},
      {".toml", "version = 3\n" + v3_tables},       {"no-version.toml", v3_tables},
      {"v2.toml", "version = 2\n" + v3_tables},
  };
  for (const auto& [other, text] : others) {
    Node n;
    lay_out_k0s(n, kK0sV3, "v2.2.1");
    n.dir.write("host/etc/k0s/containerd.d/" + other, text);
    const auto before = snapshot(n.host);
    auto report = run_install(n.options(), n.env());
    EXPECT_FALSE(report.ok()) << other << " was not seen";
    if (report.ok()) continue;
    EXPECT_NE(report.failure->find(other), std::string::npos) << *report.failure;
    EXPECT_NE(report.failure->find("--runtime-name"), std::string::npos) << *report.failure;
    EXPECT_FALSE(report.changed_anything());
    EXPECT_EQ(snapshot(n.host), before);
    auto opt = n.options();
    opt.runtime_name = "gpufence";
    auto renamed = run_install(opt, n.env());
    EXPECT_TRUE(renamed.ok()) << render_install_report(renamed);
  }
}

// A link planted at the drop-in after install, to a file holding install's text: uninstall does
// not put the user's bytes back through it; it stops, naming the link.
TEST(InstallK0s, UninstallDoesNotWriteThroughALinkPlantedSinceInstall) {
  Node n;
  lay_out_k0s(n, kK0sV3, "v2.2.1");
  n.dir.write("host/etc/k0s/containerd.d/gpufence.toml", "# the user's own, by hand\n");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  const fs::path drop_in = n.host / "etc/k0s/containerd.d/gpufence.toml";
  // Someone swaps the file for a link to another file holding install's very text.
  const std::string ours = slurp(drop_in);
  n.dir.write("host/etc/victim.toml", ours);
  fs::remove(drop_in);
  fs::create_symlink("/etc/victim.toml", drop_in);
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_FALSE(un.ok()) << render_install_report(un);
  EXPECT_NE(un.failure->find("symbolic link"), std::string::npos) << *un.failure;
  EXPECT_EQ(slurp(n.host / "etc/victim.toml"), ours) << "nothing written through the link";
  EXPECT_TRUE(fs::is_symlink(drop_in));
  // The link gone, uninstall puts the user's file back.
  fs::remove(drop_in);
  n.dir.write("host/etc/k0s/containerd.d/gpufence.toml", ours);
  auto again = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(again.ok()) << render_install_report(again);
  EXPECT_EQ(slurp(drop_in), "# the user's own, by hand\n");
}

// The backup install made is gpufence's own file: a link planted at its name (to a root-only
// file) is refused, and nothing it names is copied into the config. On the old code uninstall
// "restored" the config from the link's target and left it readable by everyone.
TEST(InstallFlow, UninstallDoesNotRestoreFromALinkPlantedAtTheBackup) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  fs::path backup;
  for (const auto& e : fs::directory_iterator(n.host / "etc/containerd"))
    if (e.path().filename().string().starts_with("config.toml.bak")) backup = e.path();
  ASSERT_FALSE(backup.empty()) << "install kept no backup";
  n.dir.write("host/root/secret", "SECRET=1\n");
  fs::permissions(n.host / "root/secret", fs::perms::owner_read | fs::perms::owner_write);
  const std::string installed = slurp(n.host / "etc/containerd/config.toml");
  fs::remove(backup);
  fs::create_symlink("/root/secret", backup);
  auto un = run_uninstall(n.options(), n.env());
  EXPECT_FALSE(un.ok()) << render_install_report(un);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), installed) << "restored through a link";
  EXPECT_EQ(slurp(n.host / "root/secret"), "SECRET=1\n");
}

TEST(InstallFlow, PlainContainerdInstallsRestartsOnceAndVerifies) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(report.distribution, "containerd");
  ASSERT_EQ(n.containerd->commands.size(), 1u);
  EXPECT_EQ(n.containerd->commands[0],
            (std::vector<std::string>{"systemctl", "restart", "containerd"}));
  // The probe dialled the socket under the host root.
  EXPECT_EQ(n.containerd->sockets.back(), (n.host / "run/containerd/containerd.sock").string());
  std::string cfg = slurp(n.host / "etc/containerd/config.toml");
  EXPECT_TRUE(cfg.starts_with(kPlainConfig)) << "the user's text must be kept as it was";
  EXPECT_NE(cfg.find("BinaryName = '/usr/local/bin/gpufence-runtime'"), std::string::npos) << cfg;
  EXPECT_EQ(fs::read_symlink(n.host / "usr/local/bin/gpufence-runtime").parent_path(),
            "/usr/local/lib/gpufence");
  EXPECT_NE(slurp(n.host / "etc/gpufence/runtime.toml").find("trusted_channels"),
            std::string::npos);
  EXPECT_NE(slurp(n.host / "etc/cdi/nvidia.yaml").find("# hook /usr/local/bin/gpufence-runtime"),
            std::string::npos);
  std::string screen = render_install_report(report);
  EXPECT_NE(screen.find("verify"), std::string::npos);
  EXPECT_NE(screen.find("installed in"), std::string::npos);
}

TEST(InstallFlow, SecondInstallChangesNothingAndRestartsNothing) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  auto before = snapshot(n.host);
  auto again = run_install(n.options(), n.env());
  ASSERT_TRUE(again.ok()) << render_install_report(again);
  EXPECT_EQ(n.containerd->commands.size(), 1u) << "no second restart";
  EXPECT_FALSE(again.changed_anything()) << render_install_report(again);
  EXPECT_EQ(snapshot(n.host), before);
  EXPECT_NE(render_install_report(again).find("nothing to change"), std::string::npos);
}

TEST(InstallFlow, RestartsWhenTheFileHasTheHandlerButContainerdNeverLoadedIt) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  // containerd restarted by someone on another config: the handler is gone from the live one.
  n.containerd->ignores_config = true;
  n.containerd->run({"systemctl", "restart", "containerd"});
  n.containerd->ignores_config = false;
  n.containerd->commands.clear();
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(n.containerd->commands.size(), 1u);
}

TEST(InstallFlow, Microk8sTemplateGetsTheHandlerAndSnapRestart) {
  Node n;
  n.dir.write("host/var/snap/microk8s/current/args/containerd-template.toml",
              slurp(test::source_path("tests/fixtures/containerd/microk8s-template.toml")));
  n.start_containerd("/var/snap/microk8s/current/args/containerd-template.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(report.distribution, "microk8s");
  ASSERT_EQ(n.containerd->commands.size(), 1u);
  EXPECT_EQ(n.containerd->commands[0],
            (std::vector<std::string>{"snap", "restart", "microk8s.daemon-containerd"}));
  EXPECT_EQ(n.containerd->sockets.back(),
            (n.host / "var/snap/microk8s/common/run/containerd.sock").string());
  std::string tmpl = slurp(n.host / "var/snap/microk8s/current/args/containerd-template.toml");
  EXPECT_NE(tmpl.find("${SNAP_DATA}"), std::string::npos) << "placeholders stay for microk8s";
  // setup's "restart microk8s" advice is not passed on: install restarted it.
  EXPECT_EQ(render_install_report(report).find("note: restart"), std::string::npos);
}

TEST(InstallFlow, WhatSetupFindsWrongInTheFileReachesTheScreen) {
  Node n;
  // The seed's snippet: its nvidia runtime sits under the v1 linux plugin, where the CRI plugin
  // never looks. setup leaves that section alone and says so; install shows it.
  n.dir.write("host/etc/containerd/config.toml",
              slurp(test::source_path("tests/fixtures/containerd/seed-snippet.toml")));
  n.start_containerd("/etc/containerd/config.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  std::string screen = render_install_report(report);
  EXPECT_NE(screen.find("note: already in /etc/containerd/config.toml (left alone)"),
            std::string::npos)
      << screen;
  EXPECT_NE(screen.find("io.containerd.runtime.v1.linux"), std::string::npos) << screen;
}

TEST(InstallFlow, K3sAgentTemplateIsCreatedAndK3sAgentRestarted) {
  Node n;
  n.dir.write("host/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "# rendered by k3s\n");
  n.dir.write("host/etc/systemd/system/k3s-agent.service", "");
  n.start_containerd("/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(report.distribution, "k3s");
  EXPECT_EQ(n.containerd->commands.at(0),
            (std::vector<std::string>{"systemctl", "restart", "k3s-agent"}));
  std::string tmpl = slurp(n.host / "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl");
  EXPECT_TRUE(tmpl.starts_with("{{ template \"base\" . }}")) << tmpl;
  // Uninstall removes the template it created rather than leaving an empty override.
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_FALSE(fs::exists(n.host / "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"));
}

TEST(InstallFlow, Rke2UsesItsOwnTemplateAndUnit) {
  Node n;
  n.dir.write("host/var/lib/rancher/rke2/agent/etc/containerd/config.toml", "");
  n.dir.write("host/usr/local/lib/systemd/system/rke2-server.service", "");
  n.start_containerd("/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(n.containerd->commands.at(0),
            (std::vector<std::string>{"systemctl", "restart", "rke2-server"}));
  EXPECT_TRUE(fs::exists(n.host / "var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl"));
}

TEST(InstallFlow, FromADaemonSetHostCommandsGoThroughNsenter) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto opt = n.options();
  opt.host_exec = HostExec::nsenter;
  ASSERT_TRUE(run_install(opt, n.env()).ok());
  EXPECT_EQ(n.containerd->commands.at(0),
            (std::vector<std::string>{"nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--",
                                      "systemctl", "restart", "containerd"}));
  // Through nsenter the shim is run by its host path, in the host's mount namespace.
  EXPECT_EQ(n.containerd->smoke_tests.at(0),
            (std::vector<std::string>{"nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--",
                                      "/usr/local/bin/gpufence-runtime", "--gpufence-help"}));
}

TEST(InstallFlow, FailedRestartPutsThePreviousConfigBack) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->restart_fails = true;
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("restart: `systemctl restart containerd` exited 1"),
            std::string::npos)
      << *report.failure;
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kPlainConfig);
  EXPECT_NE(render_install_report(report).find("restored the previous /etc/containerd/config.toml"),
            std::string::npos);
  // The record no longer claims the config: uninstall leaves the user's file alone and still
  // removes the files install did add.
  n.containerd->restart_fails = false;
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kPlainConfig);
  EXPECT_FALSE(fs::exists(n.host / "usr/local/bin/gpufence-runtime"));
}

TEST(InstallFlow, ContainerdThatDoesNotComeBackFailsAndRestoresTheConfig) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->comes_back = false;
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("containerd did not answer on /run/containerd/containerd.sock"),
            std::string::npos)
      << *report.failure;
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kPlainConfig);
}

TEST(InstallFlow, ContainerdReadingAnotherFileIsCaughtByVerify) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->ignores_config = true;
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("has no runtime nvidia"), std::string::npos) << *report.failure;
  EXPECT_NE(report.failure->find("the file it reads?"), std::string::npos);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kPlainConfig);
}

TEST(InstallFlow, BrokenConfigIsRefusedBeforeAnythingRestarts) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", "version = 2\n[plugins\n");
  n.start_containerd("/etc/containerd/config.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(report.failure->starts_with("containerd config: ")) << *report.failure;
  EXPECT_TRUE(n.containerd->commands.empty());
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), "version = 2\n[plugins\n");
}

TEST(InstallFlow, UninstallRestoresTheUsersBytesAndRemovesWhatInstallAdded) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto before = snapshot(n.host);
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(n.containerd->commands.size(), 2u);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
  auto again = run_uninstall(n.options(), n.env());
  EXPECT_TRUE(again.ok());
  EXPECT_NE(render_install_report(again).find("nothing installed"), std::string::npos);
}

// A killed run's temp files, of every writer and of earlier releases, go with uninstall; a file
// that merely resembles one, or another file's temp, is the user's and stays (on the rules before
// common/file.hpp's one, the prefix ".config.toml.tmp-" and ".gpufence-" took the user's files).
TEST(InstallFlow, UninstallRemovesEveryWritersLeftoversAndNothingElse) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto expected = snapshot(n.host);
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  const std::vector<std::string> leftovers = {
      "etc/containerd/" + temp_name_for("config.toml", 0),
      "etc/containerd/.config.toml.gpufence-123",  // the update-ldcache hook's old shape
      "etc/gpufence/" + temp_name_for("install-state.json", 4),
      "etc/gpufence/" + temp_name_for("runtime.toml", 0),
      "etc/cdi/" + temp_name_for("nvidia.yaml", 1),
      "usr/local/bin/.gpufence-runtime.tmp-4242",  // the link swap's old shape
      "usr/local/bin/" + temp_name_for("gpufence-runtime", 2),
      "usr/local/lib/gpufence/.gpufence-runtime-0123456789abcdef.gpufence-55-1",
  };
  const std::vector<std::string> decoys = {
      "etc/containerd/.config.toml.tmp-backup", "etc/containerd/config.toml.tmp",
      "etc/containerd/" + temp_name_for("other.toml", 0),
      "usr/local/bin/.gpufence-runtime.tmp-mine", "usr/local/lib/gpufence/.gpufence-notes"};
  for (const auto& rel : leftovers) n.dir.write("host/" + rel, "left by a killed run");
  for (const auto& rel : decoys) {
    n.dir.write("host/" + rel, "the user's");
    expected[(n.host / rel).string()] = "the user's";
  }
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  for (const auto& rel : leftovers) EXPECT_FALSE(fs::exists(n.host / rel)) << rel;
  EXPECT_EQ(snapshot(n.host), expected) << render_install_report(un);
}

// containerd 2.x: version 3, where setup adds a drop-in and lists it in the main file's imports.
const std::string kVersion3Config =
    "# the user's own file\nversion = 3\nimports = []\n"
    "[plugins.'io.containerd.cri.v1.runtime'.containerd]\n"
    "  default_runtime_name = 'runc'\n"
    "  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
    "    runtime_type = 'io.containerd.runc.v2'\n"
    "    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
    "      SystemdCgroup = true\n";
const char* kDropIn = "etc/containerd/conf.d/99-gpufence.toml";

TEST(InstallFlow, Version3InstallAddsTheDropInAndUninstallTakesBothBack) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  auto before = snapshot(n.host);
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_TRUE(fs::exists(n.host / kDropIn));
  EXPECT_NE(slurp(n.host / "etc/containerd/config.toml")
                .find("imports = [\"/etc/containerd/conf.d/99-gpufence.toml\"]"),
            std::string::npos)
      << slurp(n.host / "etc/containerd/config.toml");
  auto state = slurp(n.host / "etc/gpufence/install-state.json");
  EXPECT_NE(state.find("/etc/containerd/conf.d/99-gpufence.toml"), std::string::npos) << state;
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
}

// A failed restart on a version 3 node puts both files back: the user's config with its bytes
// (the record used to keep one file: the drop-in was taken for the config, so a rollback would
// have removed the config and its backup; read from that code, never run on a host).
TEST(InstallFlow, Version3FailedRestartPutsBothFilesBack) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->restart_fails = true;
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kVersion3Config)
      << render_install_report(report);
  EXPECT_FALSE(fs::exists(n.host / kDropIn)) << render_install_report(report);
  for (const auto& e : fs::directory_iterator(n.host / "etc/containerd"))
    EXPECT_EQ(e.path().filename().string().find(".bak-"), std::string::npos) << e.path();
}

TEST(InstallFlow, Version3UninstallTouchesNothingWhenTheDropInWasEdited) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  std::string main_after = slurp(n.host / "etc/containerd/config.toml");
  std::string edited = slurp(n.host / kDropIn) + "# tuned by hand\n";
  n.dir.write(std::string("host/") + kDropIn, edited);
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_FALSE(un.ok());
  EXPECT_NE(un.failure->find("99-gpufence.toml was edited after install; left alone"),
            std::string::npos)
      << *un.failure;
  EXPECT_EQ(slurp(n.host / kDropIn), edited);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), main_after);
}

// A second install that changes the config again (another handler name) keeps the first one's
// record of each file: uninstall still gives back the user's bytes, and no backup is left over.
TEST(InstallFlow, AReinstallThatChangesTheConfigStillUninstallsToTheUsersBytes) {
  for (const std::string& config : {kPlainConfig, kVersion3Config}) {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", config);
    n.start_containerd("/etc/containerd/config.toml");
    auto before = snapshot(n.host);
    ASSERT_TRUE(run_install(n.options(), n.env()).ok());
    auto again = n.options();
    again.runtime_name = "gpufence";
    auto second = run_install(again, n.env());
    ASSERT_TRUE(second.ok()) << render_install_report(second);
    auto un = run_uninstall(again, n.env());
    ASSERT_TRUE(un.ok()) << render_install_report(un);
    EXPECT_EQ(snapshot(n.host), before) << config << render_install_report(un);
  }
}

// A record written before drop-ins were recorded (one file under "config") still uninstalls.
TEST(InstallFlow, AnOlderStateRecordStillUninstalls) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto before = snapshot(n.host);
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  auto j = nlohmann::json::parse(slurp(n.host / "etc/gpufence/install-state.json"));
  auto file = j["config"]["files"][0];
  j["config"].erase("files");
  j["config"]["existed"] = file["existed"];
  j["config"]["backup"] = file["backup"];
  j["config"]["written"] = file["written"][0];  // one string before every text was kept
  j["cdiSpec"] = j["cdiSpec"]["path"];          // a path only, before its texts were kept
  n.dir.write("host/etc/gpufence/install-state.json", j.dump(2));
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before);
}

TEST(InstallFlow, UninstallLeavesAConfigEditedSinceInstall) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  std::string edited = slurp(n.host / "etc/containerd/config.toml") + "# edited by hand\n";
  n.dir.write("host/etc/containerd/config.toml", edited);
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_FALSE(un.ok());
  EXPECT_NE(un.failure->find("was edited after install; left alone"), std::string::npos);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), edited);
  EXPECT_EQ(n.containerd->commands.size(), 1u);
}

// The handler setup writes is the one the runtime's trust model needs: containerd copies the
// device plugin's CDI annotation into the container only with container_annotations
// (docs/trust-model.md). Setup's backup is "<file>.bak-<UTC time>", named as the host names it.
TEST(InstallFlow, HandlerCopiesTheCdiAnnotationAndTheBackupIsNamedAsOnTheHost) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  auto cfg = parse_containerd_config(slurp(n.host / "etc/containerd/config.toml"), "config.toml");
  ASSERT_TRUE(cfg) << cfg.error().message;
  auto handlers = cri_runtimes(*cfg);
  auto nvidia = std::find_if(handlers.begin(), handlers.end(),
                             [](const RuntimeHandler& h) { return h.name == "nvidia"; });
  ASSERT_NE(nvidia, handlers.end());
  EXPECT_EQ(nvidia->container_annotations, std::vector<std::string>{"cdi.k8s.io/*"});
  EXPECT_TRUE(nvidia->pod_annotations.empty());
  const std::string state_file = InstallOptions{}.state_file;
  auto state = parse_install_state(slurp(n.fs_.resolve(state_file)), state_file);
  ASSERT_TRUE(state) << state.error().message;
  ASSERT_EQ(state->config_files.size(), 1u);
  const std::string& backup = state->config_files[0].backup;
  EXPECT_TRUE(backup.starts_with("/etc/containerd/config.toml.bak-"))
      << backup << ": a host path, not one under the installer's --host-root";
  EXPECT_EQ(slurp(n.fs_.resolve(backup)), kPlainConfig);
  EXPECT_NE(render_install_report(report).find("(backup " + backup + ")"), std::string::npos);
}

// A config that is a symlink (config management keeps the real file elsewhere) stays one:
// install writes its target, and uninstall puts the user's bytes back there, not over the link.
TEST(InstallFlow, ASymlinkedConfigStaysALinkThroughInstallAndUninstall) {
  Node n;
  n.dir.write("host/opt/ctrd/config.toml", kPlainConfig);
  fs::create_directories(n.host / "etc/containerd");
  fs::create_symlink("../../opt/ctrd/config.toml", n.host / "etc/containerd/config.toml");
  n.start_containerd("/etc/containerd/config.toml");
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  ASSERT_TRUE(fs::is_symlink(n.host / "etc/containerd/config.toml"));
  EXPECT_NE(slurp(n.host / "opt/ctrd/config.toml").find("gpufence-runtime"), std::string::npos);
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_TRUE(fs::is_symlink(n.host / "etc/containerd/config.toml"))
      << "uninstall replaced the link with a copy";
  EXPECT_EQ(slurp(n.host / "opt/ctrd/config.toml"), kPlainConfig);
}

// k3s renders a runtime named "nvidia" itself when it finds nvidia-container-runtime; setup
// then names gpufence's handler otherwise. The RuntimeClass still says "nvidia", so GPU pods
// would run under NVIDIA's runtime: install refuses, before any file changes.
TEST(InstallFlow, AHandlerNameK3sAlreadyUsesIsRefusedNotRenamed) {
  Node n;
  n.dir.write("host/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "# rendered by k3s\n");
  n.dir.write("host/etc/systemd/system/k3s-agent.service", "");
  auto ncr = n.dir.write("host/usr/bin/nvidia-container-runtime", "#!/bin/sh\n");
  fs::permissions(ncr, fs::perms::owner_all);
  n.start_containerd("/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl");
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("handler 'nvidia' is taken"), std::string::npos)
      << *report.failure;
  EXPECT_FALSE(fs::exists(n.host / "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"));
  EXPECT_TRUE(n.containerd->commands.empty());
}

TEST(InstallFlow, UserRuntimeConfigIsNeverReplacedNorRemoved) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.dir.write("host/etc/gpufence/runtime.toml", "[log]\nlevel = \"debug\"\n");
  n.start_containerd("/etc/containerd/config.toml");
  ASSERT_TRUE(run_install(n.options(), n.env()).ok());
  ASSERT_TRUE(run_uninstall(n.options(), n.env()).ok());
  EXPECT_EQ(slurp(n.host / "etc/gpufence/runtime.toml"), "[log]\nlevel = \"debug\"\n");
}

// A driver outside the host's root (the GPU Operator's /run/nvidia/driver) is not on the host's
// library path: the runtime.toml install writes names its NVML, or gpufence-nri and
// gpufence-runtime refuse every GPU container (seen on a real cluster); a path TOML could not
// hold as is is refused, changing nothing.
TEST(InstallFlow, TheRuntimeConfigNamesADriverRootsNvml) {
  const std::string lib = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
  {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto opt = n.options();
    opt.nvml_library = lib;
    auto report = run_install(opt, n.env());
    ASSERT_TRUE(report.ok()) << render_install_report(report);
    auto cfg = parse_runtime_config(slurp(n.host / "etc/gpufence/runtime.toml"), "runtime.toml");
    ASSERT_TRUE(cfg) << cfg.error().message;
    EXPECT_EQ(cfg->nvml_library, lib);
    EXPECT_TRUE(cfg->nri_node_agent_namespaces.empty());
  }
  {
    // The chart's namespace, for gpufence-nri to leave its device plugin the GPUs.
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto opt = n.options();
    opt.node_agent_namespace = "gpufence";
    ASSERT_TRUE(run_install(opt, n.env()).ok());
    auto cfg = parse_runtime_config(slurp(n.host / "etc/gpufence/runtime.toml"), "runtime.toml");
    ASSERT_TRUE(cfg) << cfg.error().message;
    EXPECT_EQ(cfg->nri_node_agent_namespaces, (std::vector<std::string>{"gpufence"}));
  }
  {
    // Another DRA driver's kind, for gpufence-nri to enforce its claims; a kind that would break
    // out of the TOML string is refused, writing nothing.
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto opt = n.options();
    opt.gpu_cdi_kinds = {"k8s.gpu.nvidia.com/claim", "example.com/accel"};
    ASSERT_TRUE(run_install(opt, n.env()).ok());
    auto cfg = parse_runtime_config(slurp(n.host / "etc/gpufence/runtime.toml"), "runtime.toml");
    ASSERT_TRUE(cfg) << cfg.error().message;
    EXPECT_EQ(cfg->gpu_cdi_kinds,
              (std::vector<std::string>{"k8s.gpu.nvidia.com/claim", "example.com/accel"}));
  }
  {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto opt = n.options();
    opt.gpu_cdi_kinds = {"a.com/b\"]\nspec_dirs = [\"/tmp"};
    EXPECT_FALSE(run_install(opt, n.env()).ok());
    EXPECT_FALSE(fs::exists(n.host / "etc/gpufence/runtime.toml"));
  }
  for (const char* bad : {"Gpufence", "x\"]\ninjected = [\"", "-x"}) {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto opt = n.options();
    opt.node_agent_namespace = bad;
    EXPECT_FALSE(run_install(opt, n.env()).ok()) << bad;
    EXPECT_FALSE(fs::exists(n.host / "etc/gpufence/runtime.toml")) << bad;
  }
  {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto opt = n.options();
    opt.nvml_library = "/x\"\ninjected = true\n\"";
    auto report = run_install(opt, n.env());
    EXPECT_FALSE(report.ok());
    EXPECT_FALSE(fs::exists(n.host / "etc/gpufence/runtime.toml"));
    EXPECT_TRUE(n.containerd->commands.empty());
  }
}

TEST(InstallFlow, AShimTheHostCannotRunIsNeverWiredIn) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->binary_runs = false;
  auto before = snapshot(n.host);
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("does not run on this host"), std::string::npos)
      << *report.failure;
  EXPECT_NE(report.failure->find("GLIBC_2.36"), std::string::npos);
  // Run directly, the shim run is the versioned file, found under the host root.
  EXPECT_EQ(n.containerd->smoke_tests.at(0).at(0).rfind(
                (n.host / "usr/local/lib/gpufence/gpufence-runtime-").string(), 0),
            0u);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kPlainConfig);
  EXPECT_TRUE(n.containerd->commands.empty());
  // A failed install takes back all it did: no shim, no link, no runtime config, no record.
  EXPECT_EQ(snapshot(n.host), before);
}

TEST(InstallFlow, CdiFailureStopsBeforeTheConfigIsTouched) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  auto env = n.env();
  env.cdi_spec = [](const std::string&) -> Result<std::string> {
    return fail(Errc::nvml, "dlopen libnvidia-ml.so.1: not found");
  };
  auto report = run_install(n.options(), env);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(*report.failure, "CDI spec: dlopen libnvidia-ml.so.1: not found");
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), kPlainConfig);
  EXPECT_TRUE(n.containerd->commands.empty());
}

TEST(InstallBinary, LinkSwapKeepsThePreviousVersionAndPrunesOlder) {
  TempDir d;
  HostFs host(d / "host");
  BinaryInstallOptions opt;
  std::vector<std::string> targets;
  for (int i = 0; i < 3; ++i) {
    opt.source = d.write("src", std::string("\x7f"
                                            "ELF v",
                                            6) +
                                    std::to_string(i))
                     .string();
    auto got = install_binary(host, opt);
    ASSERT_TRUE(got) << got.error().message;
    EXPECT_EQ(got->changed, Changed::yes);
    targets.push_back(got->target);
    EXPECT_EQ(fs::read_symlink(host.resolve(opt.link)).string(), got->target);
    struct stat st {};
    ASSERT_EQ(::stat(host.resolve(got->target).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0755u);
  }
  EXPECT_FALSE(fs::exists(host.resolve(targets[0]))) << "two versions back: pruned";
  EXPECT_TRUE(fs::exists(host.resolve(targets[1]))) << "the one just replaced may be running";
  auto same = install_binary(host, opt);
  ASSERT_TRUE(same);
  EXPECT_EQ(same->changed, Changed::no);
}

// The link swap makes its new link under the one temp-name rule and never removes what already
// holds a name (before it, ".<link>.tmp-<pid>" was unlinked first, whatever it was).
TEST(InstallBinary, LinkSwapTakesAFreeTempNameAndRemovesNothing) {
  TempDir d;
  HostFs host(d / "host");
  BinaryInstallOptions opt;
  opt.source = d.write("src", std::string("\x7f"
                                          "ELF v",
                                          6))
                   .string();
  const fs::path bin = host.resolve("/usr/local/bin");
  const std::vector<std::string> taken = {temp_name_for("gpufence-runtime", 0),
                                          ".gpufence-runtime.tmp-" + std::to_string(::getpid())};
  for (const auto& name : taken) d.write("host/usr/local/bin/" + name, "not the swap's");
  auto got = install_binary(host, opt);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(fs::read_symlink(bin / "gpufence-runtime").string(), got->target);
  for (const auto& name : taken) EXPECT_EQ(slurp(bin / name), "not the swap's") << name;
  EXPECT_FALSE(fs::exists(bin / temp_name_for("gpufence-runtime", 1)))
      << "the swap's own temp name was renamed away";
}

TEST(InstallBinary, RefusesWhatIsNotAnExecutable) {
  TempDir d;
  BinaryInstallOptions opt;
  opt.source = d.write("src", "#!/bin/sh\n").string();
  auto got = install_binary(HostFs(d / "host"), opt);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("is not an ELF executable"), std::string::npos);
}

TEST(InstallBinary, RemoveLeavesALinkThatIsNotOurs) {
  TempDir d;
  HostFs host(d / "host");
  fs::create_directories(host.resolve("/usr/local/bin"));
  fs::create_symlink("/opt/other/gpufence-runtime",
                     host.resolve("/usr/local/bin/gpufence-runtime"));
  auto removed = remove_binary(host, BinaryInstallOptions{});
  ASSERT_TRUE(removed);
  EXPECT_TRUE(removed->empty());
  EXPECT_TRUE(fs::is_symlink(host.resolve("/usr/local/bin/gpufence-runtime")));
}

// ---- every containerd line, a journal before any change, kills anywhere ----

std::string fixture(const std::string& name) {
  return slurp(test::source_path("tests/fixtures/containerd/" + name));
}

// containerd 2.3's own default (version 4, imports = ['/etc/containerd/conf.d/*.toml']): the
// drop-in is version 4 like the root file, and the root file is not touched at all, since the
// user's glob already imports the drop-in (on 04417a7: "unsupported config version 4").
TEST(InstallJournal, Version4DefaultGetsAVersion4DropInAndTheRootFileStaysAsItIs) {
  Node n;
  const std::string root = fixture("containerd-2.3-config-default.toml");
  n.dir.write("host/etc/containerd/config.toml", root);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto report = run_install(n.options(), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), root);
  auto drop = slurp(n.host / kDropIn);
  EXPECT_NE(drop.find("version = 4"), std::string::npos) << drop;
  auto cfg = parse_containerd_config(drop, "drop-in");
  ASSERT_TRUE(cfg) << cfg.error().message;
  EXPECT_EQ(cfg->version, 4);
  auto un = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
}

// containerd merges every file it imports into one runtime table: another conf.d file that adds
// pod_annotations admitting cdi.k8s.io/, a runtime_path, or another runtime_type to gpufence's
// handler leaves its BinaryName in place but lets pods name devices, or never runs it. Install
// judges what containerd loaded (CRI status) and fails, naming the key, with the host put back;
// on the old code it reported success. With the other file's key harmless, it installs.
TEST(InstallJournal, AnotherDropInWeakeningTheHandlerFailsVerify) {
  const std::pair<std::string, std::string> weak[] = {
      {"pod_annotations = [\"cdi.k8s.io/*\"]", "pod_annotations pattern"},
      {"pod_annotations = [\"cdi*/*\"]", "pod_annotations pattern"},
      {"pod_annotations = [\"*\"]", ""},  // Go's * never matches the / of cdi.k8s.io/
      {"runtime_path = \"/opt/other/containerd-shim\"", "runtime_path"},
      {"runtime_type = \"io.containerd.kata.v2\"", "runtime_type"},
      {"pod_annotations = [\"io.kubernetes.cri.*\"]", ""},
  };
  for (const auto& [key, named] : weak) {
    Node n;
    const std::string root = fixture("containerd-2.3-config-default.toml");
    n.dir.write("host/etc/containerd/config.toml", root);
    // Sorts after 99-gpufence.toml, so its keys win the merge.
    n.dir.write(
        "host/etc/containerd/conf.d/99-z-other.toml",
        "version = 4\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\n" +
            key + "\n");
    n.start_containerd("/etc/containerd/config.toml");
    n.containerd->release = "v2.3.4";
    auto before = snapshot(n.host);
    auto report = run_install(n.options(), n.env());
    if (named.empty()) {
      EXPECT_TRUE(report.ok()) << key << "\n" << render_install_report(report);
      continue;
    }
    EXPECT_FALSE(report.ok()) << key << ": reported installed";
    if (report.ok()) continue;
    EXPECT_NE(report.failure->find(named), std::string::npos) << *report.failure;
    EXPECT_EQ(snapshot(n.host), before) << key << ": the host was not put back";
  }
}

// A new config on a node whose containerd is 2.3 is written in version 4, on 2.1 in version 3.
TEST(InstallJournal, ANewConfigIsWrittenInTheVersionOfTheRunningContainerd) {
  for (auto [release, version] : {std::pair{"v2.3.4", 4}, {"v2.1.9", 3}, {"1.6.20~ds1", 2}}) {
    Node n;
    n.start_containerd("/etc/containerd/config.toml");
    n.containerd->release = release;
    auto report = run_install(n.options(Distribution::containerd), n.env());
    ASSERT_TRUE(report.ok()) << release << "\n" << render_install_report(report);
    auto cfg = parse_containerd_config(slurp(n.host / "etc/containerd/config.toml"), "new");
    ASSERT_TRUE(cfg);
    EXPECT_EQ(cfg->version, version) << release;
  }
}

TEST(InstallJournal, ReleaseToConfigVersion) {
  EXPECT_EQ(config_version_of_release("1.6.20~ds1"), 2);
  EXPECT_EQ(config_version_of_release("v1.7.24"), 2);
  EXPECT_EQ(config_version_of_release("v2.0.4-k3s2"), 3);
  EXPECT_EQ(config_version_of_release("2.1.9+ds1-5"), 3);
  EXPECT_EQ(config_version_of_release("v2.3.4"), 4);
  EXPECT_EQ(config_version_of_release("garbage"), std::nullopt);
}

// A refusal changes nothing at all: no binary, no link, no runtime.toml, no CDI spec, no record
// (on 04417a7 the binary, its link and runtime.toml stayed, with no state to remove them).
TEST(InstallJournal, ARefusedInstallChangesNothing) {
  for (std::string config :
       {std::string("version = 5\n"), std::string("version = 2\n[[broken\n")}) {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", config);
    n.start_containerd("/etc/containerd/config.toml");
    auto before = snapshot(n.host);
    auto report = run_install(n.options(), n.env());
    ASSERT_FALSE(report.ok());
    EXPECT_EQ(snapshot(n.host), before) << render_install_report(report);
    auto un = run_uninstall(n.options(), n.env());
    EXPECT_TRUE(un.ok());
  }
}

// A failed first install (containerd did not come back) takes back everything, not only the
// config (04417a7 left the binary, the link, runtime.toml and the state).
TEST(InstallJournal, AFailedFirstInstallLeavesTheNodeAsItWas) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->comes_back = false;
  auto before = snapshot(n.host);
  auto report = run_install(n.options(), n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(report);
}

// The journal is on disk before the first host byte changes, and names every file.
TEST(InstallJournal, TheRecordNamesEveryFileBeforeTheFirstChanges) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  auto before = snapshot(n.host);
  auto env = n.env();
  std::string journal;
  std::map<std::string, std::string> at_journal;
  env.checkpoint = [&](std::string_view step) {
    if (step != "journal") return;
    journal = slurp(n.host / "etc/gpufence/install-state.json");
    at_journal = snapshot(n.host);
  };
  ASSERT_TRUE(run_install(n.options(), env).ok());
  at_journal.erase((n.host / "etc/gpufence/install-state.json").string());
  // The lock file comes first: the run holds it before it reads the record (install/lock.hpp).
  at_journal.erase((n.host / "etc/gpufence/install.lock").string());
  EXPECT_EQ(at_journal, before);
  for (const char* named : {"\"installing\"", "/etc/containerd/config.toml.bak-",
                            "/etc/containerd/conf.d/99-gpufence.toml", "/etc/cdi/nvidia.yaml",
                            "/etc/gpufence/runtime.toml", "/usr/local/bin/gpufence-runtime",
                            "\"/usr/local/lib/gpufence\"", "\"/etc/containerd/conf.d\""})
    EXPECT_NE(journal.find(named), std::string::npos) << named << "\n" << journal;
}

// SIGKILL at every step boundary of a first install, then uninstall first or install first:
// either way the node ends with the user's bytes, or a complete recorded install that
// uninstalls to them (04417a7: a kill after the config write left no record, and uninstall
// said "nothing installed" with the handler in the config).
enum class Next { uninstall, install };

void kill_then(const std::string& config, const std::string& kill_at, Next next,
               EnforcementRequest mode = EnforcementRequest::runtime) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", config);
  n.start_containerd("/etc/containerd/config.toml");
  if (mode != EnforcementRequest::runtime) n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto options = [&] {
    auto o = n.options();
    o.enforcement = mode;
    return o;
  };
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto env = n.env();
    env.checkpoint = [&](std::string_view step) {
      if (step == kill_at) ::raise(SIGKILL);
    };
    run_install(options(), env);
    ::_exit(3);  // the kill point was never reached
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << kill_at;
  // containerd as the killed run left it: restarted on the new config from "restart" on.
  if (kill_at == "restart") n.containerd->reload();
  std::string where = "killed after '" + kill_at + "'";
  if (next == Next::install) {
    auto again = run_install(options(), n.env());
    ASSERT_TRUE(again.ok()) << where << "\n" << render_install_report(again);
    auto state = slurp(n.host / "etc/gpufence/install-state.json");
    EXPECT_NE(state.find("\"phase\": \"installed\""), std::string::npos) << where;
  }
  auto un = run_uninstall(options(), n.env());
  ASSERT_TRUE(un.ok()) << where << "\n" << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << where << "\n" << render_install_report(un);
  auto loaded = n.containerd->loaded_runtimes("s", std::chrono::milliseconds(1));
  ASSERT_TRUE(loaded);
  for (const auto& l : *loaded) EXPECT_NE(l.name, "nvidia") << where;
}

const char* const kKillPoints[] = {"journal",  "runtime binary",    "runtime config",
                                   "CDI spec", "containerd config", "restart"};

TEST(InstallJournal, KillAtEveryStepThenUninstall) {
  for (const auto& config : {kPlainConfig, kVersion3Config})
    for (const char* at : kKillPoints) kill_then(config, at, Next::uninstall);
}

TEST(InstallJournal, KillAtEveryStepThenInstallThenUninstall) {
  for (const auto& config : {kPlainConfig, kVersion3Config})
    for (const char* at : kKillPoints) kill_then(config, at, Next::install);
}

// The same with --enforcement nri (containerd 2.3.4): gpufence-nri's binary and its plugin_path
// link are taken back too, whatever step the kill lands after.
TEST(InstallEnforcement, KillAtEveryNriStepThenUninstallOrInstall) {
  for (Next next : {Next::uninstall, Next::install})
    for (const char* at : {"journal", "runtime binary", "nri plugin", "runtime config", "CDI spec",
                           "containerd config", "restart"})
      kill_then(kVersion3Config, at, next, EnforcementRequest::nri);
}

// An uninstall stopped after restoring the config (before it removed the record): the next
// uninstall sees the user's bytes, restarts the containerd that still runs the handler, and
// finishes with exit 0; an install instead starts afresh.
TEST(InstallJournal, AnUninstallStoppedHalfWayIsFinishedByTheNextOne) {
  for (Next next : {Next::uninstall, Next::install}) {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    auto before = snapshot(n.host);
    ASSERT_TRUE(run_install(n.options(), n.env()).ok());
    // What the stopped uninstall did: the config restored from its backup, nothing else.
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    if (next == Next::install) {
      ASSERT_TRUE(run_install(n.options(), n.env()).ok());
    }
    auto un = run_uninstall(n.options(), n.env());
    ASSERT_TRUE(un.ok()) << render_install_report(un);
    EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
    auto loaded = n.containerd->loaded_runtimes("s", std::chrono::milliseconds(1));
    ASSERT_TRUE(loaded);
    for (const auto& l : *loaded) EXPECT_NE(l.name, "nvidia");
  }
}

// k3s on containerd 2.x: the user's config-v3.toml.tmpl is the file edited, kept byte for byte
// ahead of the block (04417a7 wrote a new config.toml.tmpl beside it, which k3s never read).
TEST(InstallJournal, K3sOnContainerd2EditsTheUsersV3Template) {
  Node n;
  const std::string dir = "host/var/lib/rancher/k3s/agent/etc/containerd/";
  const std::string user = "{{ template \"base\" . }}\n\n# my registry mirror\n";
  n.dir.write(dir + "config-v3.toml.tmpl", user);
  n.start_containerd("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl");
  n.containerd->release = "v2.0.4-k3s2";
  auto report = run_install(n.options(Distribution::k3s), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_FALSE(fs::exists(n.dir / (dir + "config.toml.tmpl")));
  auto text = slurp(n.dir / (dir + "config-v3.toml.tmpl"));
  EXPECT_EQ(text.substr(0, user.size()), user);
  EXPECT_NE(text.find("io.containerd.cri.v1.runtime"), std::string::npos) << text;
}

// Without a user template, on containerd 2.x: config-v3.toml.tmpl, with a version 3 block
// decided from what the node runs.
TEST(InstallJournal, K3sOnContainerd2WithoutATemplateWritesTheV3One) {
  Node n;
  const std::string dir = "host/var/lib/rancher/k3s/agent/etc/containerd/";
  n.dir.write(dir + ".keep", "");
  n.start_containerd("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl");
  n.containerd->release = "v2.0.4-k3s2";
  auto report = run_install(n.options(Distribution::k3s), n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_FALSE(fs::exists(n.dir / (dir + "config.toml.tmpl")));
  auto text = slurp(n.dir / (dir + "config-v3.toml.tmpl"));
  EXPECT_NE(text.find("io.containerd.cri.v1.runtime"), std::string::npos) << text;
}

}  // namespace
}  // namespace gpufence

// ---- --enforcement nri|runtime|both ----

namespace gpufence {
namespace {

TEST(InstallEnforcement, NriApiPerContainerdLine) {
  // nri@v0.12.0:pkg/api/version.go InferVersionFromRuntime.
  EXPECT_EQ(nri_api_minor("1.6.20~ds1"), std::nullopt);
  EXPECT_EQ(nri_api_minor("v1.7.13"), std::nullopt);
  EXPECT_EQ(nri_api_minor("v1.7.14"), 6);
  EXPECT_EQ(nri_api_minor("1.7.24~ds1"), 6);
  EXPECT_EQ(nri_api_minor("v1.7.25"), 6);
  EXPECT_EQ(nri_api_minor("v1.7.26"), 8);
  EXPECT_EQ(nri_api_minor("v2.0.4-k3s2"), 8);
  EXPECT_EQ(nri_api_minor("2.1.9~ds1"), 8);
  EXPECT_EQ(nri_api_minor("v2.2.0"), 10);
  EXPECT_EQ(nri_api_minor("v2.2.1"), 11);
  EXPECT_EQ(nri_api_minor("v2.3.4"), 12);
  EXPECT_EQ(nri_api_minor("garbage"), std::nullopt);
}

TEST(InstallEnforcement, AutoPicksNriOnlyWhereItFailsClosed) {
  struct Case {
    std::optional<std::string> release;
    Enforcement mode;
    bool required;
  };
  for (const auto& c : std::vector<Case>{{"v2.3.4", Enforcement::nri, true},
                                         {"v2.2.0", Enforcement::nri, true},
                                         {"v2.2.1", Enforcement::nri, true},
                                         {"2.1.9~ds1", Enforcement::runtime, false},
                                         {"1.7.24~ds1", Enforcement::runtime, false},
                                         {"1.6.20~ds1", Enforcement::runtime, false},
                                         {std::nullopt, Enforcement::runtime, false}}) {
    auto got = choose_enforcement(EnforcementRequest::automatic, c.release, false);
    ASSERT_TRUE(got) << c.release.value_or("none");
    EXPECT_EQ(got->mode, c.mode) << c.release.value_or("none");
    EXPECT_EQ(got->required_plugins, c.required) << c.release.value_or("none");
    EXPECT_FALSE(got->reason.empty());
  }
  // The reason names why: the NRI version the release has.
  auto old = choose_enforcement(EnforcementRequest::automatic, "2.1.9~ds1", false);
  EXPECT_NE(old->reason.find("v0.8"), std::string::npos) << old->reason;
  EXPECT_NE(old->reason.find("--enforcement both"), std::string::npos) << old->reason;
  auto none = choose_enforcement(EnforcementRequest::automatic, "1.6.20~ds1", false);
  EXPECT_NE(none->reason.find("has no NRI"), std::string::npos) << none->reason;
  // k3s renders its config from a template: auto stays on the handler.
  auto k3s = choose_enforcement(EnforcementRequest::automatic, "v2.3.4", true);
  EXPECT_EQ(k3s->mode, Enforcement::runtime);
}

TEST(InstallEnforcement, ExplicitRequestsTheNodeCannotCarryAreRefused) {
  EXPECT_FALSE(choose_enforcement(EnforcementRequest::nri, "1.6.20~ds1", false));
  EXPECT_FALSE(choose_enforcement(EnforcementRequest::both, "v1.7.13", false));
  EXPECT_FALSE(choose_enforcement(EnforcementRequest::nri, std::nullopt, false));
  EXPECT_FALSE(choose_enforcement(EnforcementRequest::nri, "v2.3.4", true));
  // Below v0.10: allowed, but not fail closed, and the reason says so.
  auto nri17 = choose_enforcement(EnforcementRequest::nri, "1.7.24~ds1", false);
  ASSERT_TRUE(nri17);
  EXPECT_EQ(nri17->mode, Enforcement::nri);
  EXPECT_FALSE(nri17->required_plugins);
  EXPECT_NE(nri17->reason.find("not guaranteed while gpufence-nri is down"), std::string::npos);
  auto both = choose_enforcement(EnforcementRequest::both, "v2.3.4", false);
  ASSERT_TRUE(both);
  EXPECT_EQ(both->mode, Enforcement::both);
  EXPECT_TRUE(both->required_plugins);
  auto rt = choose_enforcement(EnforcementRequest::runtime, "v2.3.4", false);
  EXPECT_EQ(rt->mode, Enforcement::runtime);
  EXPECT_FALSE(rt->required_plugins);
  EXPECT_FALSE(parse_enforcement_request("shim"));
  EXPECT_EQ(parse_enforcement_request("auto"), EnforcementRequest::automatic);
}

// containerd 2.3.4 with its own default config: auto picks nri; the drop-in enables NRI and
// requires gpufence-nri (with the toleration), writes no handler; uninstall gives the bytes back.
TEST(InstallEnforcement, Auto2_3InstallsNriFailClosedAndUninstallRestoresTheBytes) {
  Node n;
  const std::string root = fixture("containerd-2.3-config-default.toml");
  n.dir.write("host/etc/containerd/config.toml", root);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::automatic;
  auto report = run_install(opt, n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(report.enforcement, Enforcement::nri);
  EXPECT_EQ(slurp(n.host / "etc/containerd/config.toml"), root);
  auto drop = parse_containerd_config(slurp(n.host / kDropIn), "drop-in");
  ASSERT_TRUE(drop) << drop.error().message;
  auto s = nri_settings(*drop);
  EXPECT_TRUE(s.enabled && s.explicitly_set);
  EXPECT_TRUE(s.validator_enabled);
  const std::vector<std::string> both{"gpufence-nri", "gpufence-fence"};
  EXPECT_EQ(s.required_plugins, both);
  EXPECT_EQ(s.tolerate_annotation, "") << "no waiver a pod can set";
  EXPECT_EQ(slurp(n.host / kDropIn).find("tolerate"), std::string::npos);
  EXPECT_TRUE(cri_runtimes(*drop).empty()) << "nri mode writes no handler";
  // What containerd loaded (root + drop-in) has the validator on.
  EXPECT_TRUE(n.containerd->nri.validator_enabled);
  EXPECT_EQ(n.containerd->nri.required_plugins, both);
  // Verified on NRI's socket, under the host root: /var/run's absolute link followed inside it
  // (not to this process's own /run).
  ASSERT_FALSE(n.containerd->nri_sockets.empty());
  EXPECT_EQ(n.containerd->nri_sockets.back(),
            fs::canonical(n.host / "run/nri").string() + "/nri.sock");
  auto state = parse_install_state(slurp(n.host / "etc/gpufence/install-state.json"), "state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->enforcement, "nri");
  EXPECT_EQ(state->nri_socket, "/var/run/nri/nri.sock");
  auto screen = render_install_report(report);
  EXPECT_NE(screen.find("enforcement"), std::string::npos);
  EXPECT_NE(screen.find("NRI v0.12"), std::string::npos) << screen;
  EXPECT_NE(screen.find("no runtime handler 'nvidia' in this mode"), std::string::npos) << screen;
  // gpufence-nri where containerd launches it: its binary copied beside the shim, started once
  // on the host, and linked into plugin_path as NN-name.
  EXPECT_EQ(state->nri_binary_link, "/usr/local/bin/gpufence-nri");
  EXPECT_EQ(state->nri_plugin_link, "/opt/nri/plugins/10-gpufence-nri");
  EXPECT_EQ(fs::read_symlink(n.host / "opt/nri/plugins/10-gpufence-nri"),
            "/usr/local/bin/gpufence-nri");
  // The fence: the same binary under its own NN-name, recorded.
  EXPECT_EQ(state->nri_fence_link, "/opt/nri/plugins/20-gpufence-fence");
  EXPECT_EQ(fs::read_symlink(n.host / "opt/nri/plugins/20-gpufence-fence"),
            "/usr/local/bin/gpufence-nri");
  EXPECT_NE(screen.find("/opt/nri/plugins/10-gpufence-nri, /opt/nri/plugins/20-gpufence-fence ->"),
            std::string::npos)
      << screen;
  EXPECT_NE(screen.find("while gpufence-nri or gpufence-fence is not connected (required_plugins), "
                        "with no waiver"),
            std::string::npos)
      << screen;
  auto nri_target = fs::read_symlink(n.host / "usr/local/bin/gpufence-nri").string();
  EXPECT_TRUE(nri_target.starts_with("/usr/local/lib/gpufence/gpufence-nri-")) << nri_target;
  EXPECT_EQ(slurp(n.host / nri_target.substr(1)), slurp(n.nri_source));
  ASSERT_EQ(n.containerd->nri_smoke_tests.size(), 1u);
  EXPECT_EQ(n.containerd->nri_smoke_tests[0].front(), (n.host / nri_target.substr(1)).string());

  // A second install: nothing to change, no restart.
  auto snap = snapshot(n.host);
  auto again = run_install(opt, n.env());
  ASSERT_TRUE(again.ok()) << render_install_report(again);
  EXPECT_FALSE(again.changed_anything()) << render_install_report(again);
  EXPECT_EQ(snapshot(n.host), snap);
  EXPECT_EQ(n.containerd->commands.size(), 1u);

  auto un = run_uninstall(opt, n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
}

// The journal names gpufence-nri's files before the first host change; at that point none of
// them exists.
TEST(InstallEnforcement, NriPluginFilesAreJournaledBeforeTheyAreWritten) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto env = n.env();
  std::string journal;
  std::map<std::string, std::string> at_journal;
  env.checkpoint = [&](std::string_view step) {
    if (step != "journal") return;
    journal = slurp(n.host / "etc/gpufence/install-state.json");
    at_journal = snapshot(n.host);
  };
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::nri;
  ASSERT_TRUE(run_install(opt, env).ok());
  at_journal.erase((n.host / "etc/gpufence/install-state.json").string());
  // The lock file comes first: the run holds it before it reads the record (install/lock.hpp).
  at_journal.erase((n.host / "etc/gpufence/install.lock").string());
  EXPECT_EQ(at_journal, before);
  for (const char* named :
       {"\"/usr/local/bin/gpufence-nri\"", "\"/opt/nri/plugins/10-gpufence-nri\"",
        "\"/opt/nri/plugins/20-gpufence-fence\"", "\"/opt/nri/plugins\""})
    EXPECT_NE(journal.find(named), std::string::npos) << named << "\n" << journal;
}

// A gpufence-nri that does not start on the host (its glibc) stops install before the config
// requires it: nothing is left.
TEST(InstallEnforcement, NriBinaryThatDoesNotRunChangesNothing) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  n.containerd->nri_runs = false;
  auto before = snapshot(n.host);
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::nri;
  auto report = run_install(opt, n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("gpufence-nri does not run on this host"), std::string::npos)
      << *report.failure;
  EXPECT_TRUE(n.containerd->commands.empty()) << "no restart";
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(report);
}

// Someone else's plugin under gpufence-nri's NN-name is theirs: refused before any change; and
// without a gpufence-nri to copy, nri mode is refused the same way.
TEST(InstallEnforcement, NriPluginNameTakenOrSourceMissingIsRefused) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.dir.write("host/opt/nri/plugins/10-gpufence-nri", "#!/bin/sh\n");
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::nri;
  auto report = run_install(opt, n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("is not a link to /usr/local/bin/gpufence-nri"), std::string::npos)
      << *report.failure;
  EXPECT_EQ(snapshot(n.host), before);
  fs::remove(n.host / "opt/nri/plugins/10-gpufence-nri");
  // The fence's name too, and a dangling link there is someone's as well.
  fs::create_symlink("/opt/their-validator", n.host / "opt/nri/plugins/20-gpufence-fence");
  before = snapshot(n.host);
  report = run_install(opt, n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("20-gpufence-fence exists and is not a link to "
                                 "/usr/local/bin/gpufence-nri"),
            std::string::npos)
      << *report.failure;
  EXPECT_EQ(snapshot(n.host), before);
  fs::remove(n.host / "opt/nri/plugins/20-gpufence-fence");
  before = snapshot(n.host);
  opt.nri_binary.source = (n.dir / "build/absent").string();
  report = run_install(opt, n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("nri plugin"), std::string::npos) << *report.failure;
  EXPECT_EQ(snapshot(n.host), before);
}

// containerd 1.7 (version 2, NRI off by default), --enforcement both: the handler and
// `disable = false` edited into the user's file line by line; no validator (1.7 has none).
TEST(InstallEnforcement, Both17EnablesNriInPlaceBesideTheHandler) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "1.7.24~ds1";
  n.containerd->reload();
  EXPECT_FALSE(n.containerd->nri.enabled) << "1.7 has NRI off by default";
  auto before = snapshot(n.host);
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::both;
  auto report = run_install(opt, n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  std::string cfg = slurp(n.host / "etc/containerd/config.toml");
  EXPECT_TRUE(cfg.starts_with(kPlainConfig)) << cfg;
  auto parsed = parse_containerd_config(cfg, "cfg");
  ASSERT_TRUE(parsed);
  auto s = nri_settings(*parsed, 1);
  EXPECT_TRUE(s.enabled);
  EXPECT_FALSE(s.validator_enabled) << "no required_plugins below containerd 2.2";
  EXPECT_EQ(cri_runtimes(*parsed).size(), 2u) << cfg;  // runc and nvidia
  EXPECT_TRUE(n.containerd->nri.enabled);
  auto un = run_uninstall(opt, n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
}

// A containerd that comes back without NRI (it reads another file) fails verify, and the
// user's config is put back.
TEST(InstallEnforcement, NriThatDoesNotComeUpFailsVerifyAndRestoresTheConfig) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "1.7.24~ds1";
  n.containerd->ignores_config = true;
  auto before = snapshot(n.host);
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::nri;
  auto report = run_install(opt, n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("NRI socket"), std::string::npos) << *report.failure;
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(report);
}

// The user's own `disable = true` and required plugins: the drop-in turns NRI on and keeps
// the user's required plugins beside gpufence-nri.
TEST(InstallEnforcement, UsersNriSettingsAreOverriddenOnlyWhereNeeded) {
  Node n;
  const std::string root = kVersion3Config +
                           "[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n"
                           "  [plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
                           "    required_plugins = ['other-plugin']\n";
  n.dir.write("host/etc/containerd/config.toml", root);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.2.1";
  n.containerd->reload();
  EXPECT_FALSE(n.containerd->nri.enabled);
  auto before = snapshot(n.host);
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::automatic;
  auto report = run_install(opt, n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_EQ(report.enforcement, Enforcement::nri);
  EXPECT_TRUE(n.containerd->nri.enabled);
  EXPECT_EQ(n.containerd->nri.required_plugins,
            (std::vector<std::string>{"other-plugin", "gpufence-nri", "gpufence-fence"}));
  auto un = run_uninstall(opt, n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
}

// From the handler to NRI and back out: uninstall still restores the bytes from before the
// first install, and the record follows the mode.
TEST(InstallEnforcement, SwitchingModesStillUninstallsToTheUsersBytes) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto opt = n.options();
  ASSERT_TRUE(run_install(opt, n.env()).ok());
  opt.enforcement = EnforcementRequest::nri;
  auto second = run_install(opt, n.env());
  ASSERT_TRUE(second.ok()) << render_install_report(second);
  EXPECT_TRUE(second.changed_anything());
  auto state = parse_install_state(slurp(n.host / "etc/gpufence/install-state.json"), "state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->enforcement, "nri");
  auto un = run_uninstall(opt, n.env());
  ASSERT_TRUE(un.ok()) << render_install_report(un);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
}

// k3s renders its config from a template: an explicit nri is refused before anything changes.
TEST(InstallEnforcement, NriOnK3sIsRefusedBeforeAnyChange) {
  Node n;
  n.dir.write("host/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "version = 2\n");
  n.start_containerd("/var/lib/rancher/k3s/agent/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto before = snapshot(n.host);
  auto opt = n.options(Distribution::k3s);
  opt.enforcement = EnforcementRequest::nri;
  auto report = run_install(opt, n.env());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.failure->find("k3s"), std::string::npos) << *report.failure;
  EXPECT_EQ(snapshot(n.host), before);
}

// ---- one run at a time (install/lock.hpp) ----

// A first install held inside its run (a forked process, stopped after it wrote containerd's
// config) while the test runs others beside it.
struct HeldInstall {
  pid_t pid = -1;
  int go = -1;  // write a byte: the held run goes on
  // Starts `n`'s install in a child and returns once it has written the config.
  static HeldInstall start(Node& n, const InstallOptions& opt) {
    int ready[2], go[2];
    EXPECT_EQ(::pipe(ready), 0);
    EXPECT_EQ(::pipe(go), 0);
    HeldInstall h;
    h.pid = ::fork();
    if (h.pid == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      auto env = n.env();
      env.checkpoint = [&](std::string_view step) {
        if (step != "containerd config") return;
        char c = 'x';
        (void)!::write(ready[1], &c, 1);
        (void)!::read(go[0], &c, 1);
      };
      auto report = run_install(opt, env);
      ::_exit(report.ok() ? 0 : 1);
    }
    ::close(ready[1]);
    ::close(go[0]);
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the held install never reached its config";
    ::close(ready[0]);
    h.go = go[1];
    return h;
  }
  // Lets it finish: its exit status (0: installed).
  int finish() {
    char c = 'x';
    (void)!::write(go, &c, 1);
    ::close(go);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// Two installs at once: the second waits (saying for whom), then fails having changed nothing,
// and nothing of the first is undone, though the second would itself have failed (its
// containerd does not come back) and taken back what it took for its own writes. An uninstall
// meanwhile waits and fails the same way. The node ends installed once, and uninstall gives the
// user's bytes back. Without the lock, the second run's undo put the user's config back under
// the first one, which then reported "installed".
TEST(InstallLock, ASecondRunWaitsThenFailsAndUndoesNothingOfTheFirst) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  const auto before = snapshot(n.host);
  auto held = HeldInstall::start(n, n.options());
  const auto during = snapshot(n.host);
  ASSERT_NE(during, before) << "the first install wrote nothing";

  n.containerd->comes_back = false;
  auto opt = n.options();
  opt.lock_timeout = std::chrono::milliseconds(2000);
  auto env = n.env();
  std::vector<std::string> said;
  env.progress = [&](std::string_view line) { said.emplace_back(line); };
  auto second = run_install(opt, env);
  ASSERT_FALSE(second.ok()) << render_install_report(second);
  const std::string pid = "pid " + std::to_string(held.pid);
  EXPECT_NE(second.failure->find("lock: another gpufence install or uninstall (" + pid + ")"),
            std::string::npos)
      << *second.failure;
  EXPECT_NE(second.failure->find("nothing was changed"), std::string::npos) << *second.failure;
  ASSERT_EQ(said.size(), 1u) << "one line when it starts to wait";
  EXPECT_NE(said[0].find("waiting for another gpufence install or uninstall (" + pid + ")"),
            std::string::npos)
      << said[0];
  EXPECT_TRUE(n.containerd->commands.empty()) << "the second run restarted containerd";
  auto un = run_uninstall(opt, n.env());
  ASSERT_FALSE(un.ok()) << render_install_report(un);
  EXPECT_NE(un.failure->find(pid), std::string::npos) << *un.failure;
  EXPECT_EQ(snapshot(n.host), during) << "a run that waited changed something";

  n.containerd->comes_back = true;
  ASSERT_EQ(held.finish(), 0) << "the first install failed";
  std::string cfg = slurp(n.host / "etc/containerd/config.toml");
  EXPECT_TRUE(cfg.starts_with(kPlainConfig)) << cfg;
  EXPECT_NE(cfg.find("BinaryName = '/usr/local/bin/gpufence-runtime'"), std::string::npos) << cfg;
  auto state = parse_install_state(slurp(n.host / "etc/gpufence/install-state.json"), "state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->phase, "installed");
  ASSERT_EQ(state->config_files.size(), 1u);
  EXPECT_EQ(slurp(n.host / state->config_files[0].backup.substr(1)), kPlainConfig);
  EXPECT_EQ(slurp(n.host / "etc/gpufence/install.lock"), "") << "a pid left in the free lock";

  auto done = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(done.ok()) << render_install_report(done);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(done);
  EXPECT_FALSE(fs::exists(n.host / "etc/gpufence")) << "the lock file or its directory is left";
}

// The second run on a real clock: it waits while the first runs, then goes on, finds the node
// installed and says whom it waited for.
TEST(InstallLock, ASecondRunThatWaitsGoesOnOnceTheFirstIsDone) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
  n.start_containerd("/etc/containerd/config.toml");
  const auto before = snapshot(n.host);
  auto held = HeldInstall::start(n, n.options());
  int first = -1;
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    first = held.finish();
  });
  auto opt = n.options();
  opt.lock_timeout = std::chrono::milliseconds(30'000);
  auto env = n.env();
  env.sleep = [](std::chrono::milliseconds d) { std::this_thread::sleep_for(d); };
  env.now = [] { return std::chrono::steady_clock::now(); };
  auto second = run_install(opt, env);
  release.join();
  ASSERT_EQ(first, 0) << "the first install failed";
  ASSERT_TRUE(second.ok()) << render_install_report(second);
  auto screen = render_install_report(second);
  EXPECT_NE(screen.find("s for another run (pid " + std::to_string(held.pid) + ")"),
            std::string::npos)
      << screen;
  ASSERT_FALSE(second.steps.empty());
  EXPECT_NE(second.steps.front().name, "lock");
  auto state = parse_install_state(slurp(n.host / "etc/gpufence/install-state.json"), "state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->phase, "installed");
  auto done = run_uninstall(n.options(), n.env());
  ASSERT_TRUE(done.ok()) << render_install_report(done);
  EXPECT_EQ(snapshot(n.host), before) << render_install_report(done);
}

// The lock file is gpufence's own: a link planted at its name (or at its directory) is refused,
// nothing it names is written, and the run changes nothing.
TEST(InstallLock, ALinkAtTheLockFileIsRefusedNeverFollowed) {
  for (bool at_dir : {false, true}) {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", kPlainConfig);
    n.start_containerd("/etc/containerd/config.toml");
    n.dir.write("host/root/victim", "root's own\n");
    if (at_dir) {
      fs::create_directories(n.host / "root/elsewhere");
      fs::create_symlink("/root/elsewhere", n.host / "etc/gpufence");
    } else {
      fs::create_directories(n.host / "etc/gpufence");
      fs::create_symlink("/root/victim", n.host / "etc/gpufence/install.lock");
    }
    const auto before = snapshot(n.host);
    auto report = run_install(n.options(), n.env());
    ASSERT_FALSE(report.ok()) << render_install_report(report);
    EXPECT_TRUE(report.failure->starts_with("lock: ")) << *report.failure;
    EXPECT_EQ(slurp(n.host / "root/victim"), "root's own\n");
    EXPECT_FALSE(fs::exists(n.host / "root/elsewhere/install.lock"));
    EXPECT_EQ(snapshot(n.host), before) << render_install_report(report);
    EXPECT_TRUE(n.containerd->commands.empty());
  }
}

// Releases before this one wrote tolerate_missing_plugins_annotation =
// "gpufence.io/tolerate-missing-nri", a waiver any pod could set (NRI reads the key from the
// pod). A re-install takes it out, from its drop-in (containerd 2.3) and line by line from a
// version-2 file it edited in place (containerd 2.2 reading one), restarting containerd; the
// user's bytes still come back with uninstall.
TEST(InstallEnforcement, AReinstallTakesOutTheWaiverAnEarlierInstallWrote) {
  struct Case {
    std::string config, release;
    fs::path file;  // where the validator's keys go
  };
  for (const auto& c : {Case{kVersion3Config, "v2.3.4", kDropIn},
                        Case{kPlainConfig, "v2.2.1", "etc/containerd/config.toml"}}) {
    Node n;
    n.dir.write("host/etc/containerd/config.toml", c.config);
    n.start_containerd("/etc/containerd/config.toml");
    n.containerd->release = c.release;
    auto before = snapshot(n.host);
    auto opt = n.options();
    opt.enforcement = EnforcementRequest::nri;
    opt.nri_tolerate_annotation = "gpufence.io/tolerate-missing-nri";  // the old default
    auto old = run_install(opt, n.env());
    ASSERT_TRUE(old.ok()) << render_install_report(old);
    EXPECT_EQ(n.containerd->nri.tolerate_annotation, "gpufence.io/tolerate-missing-nri");
    EXPECT_NE(render_install_report(old).find("a waiver any pod can set unless an admission "
                                              "policy forbids it"),
              std::string::npos)
        << render_install_report(old);

    opt.nri_tolerate_annotation.clear();
    auto again = run_install(opt, n.env());
    ASSERT_TRUE(again.ok()) << render_install_report(again);
    auto screen = render_install_report(again);
    EXPECT_TRUE(again.changed_anything()) << screen;
    EXPECT_NE(
        screen.find("takes out the waiver an earlier install wrote: "
                    "tolerate_missing_plugins_annotation = \"gpufence.io/tolerate-missing-nri\""),
        std::string::npos)
        << screen;
    const std::string text = slurp(n.host / c.file);
    EXPECT_EQ(text.find("tolerate_missing_plugins_annotation"), std::string::npos) << text;
    EXPECT_NE(text.find("gpufence-fence"), std::string::npos) << text;
    EXPECT_EQ(n.containerd->nri.tolerate_annotation, "") << "containerd still has the waiver";
    EXPECT_EQ(n.containerd->commands.size(), 2u) << "restarted on the config without it";
    if (c.release == "v2.2.1") {
      EXPECT_TRUE(text.starts_with(c.config)) << "the user's lines kept: " << text;
    }

    auto third = run_install(opt, n.env());
    ASSERT_TRUE(third.ok()) << render_install_report(third);
    EXPECT_FALSE(third.changed_anything()) << render_install_report(third);

    auto un = run_uninstall(opt, n.env());
    ASSERT_TRUE(un.ok()) << render_install_report(un);
    EXPECT_EQ(snapshot(n.host), before) << render_install_report(un);
  }
}

// A waiver key in the user's own file (their static pods') is theirs: install leaves it, and the
// doctor reports it (nri.waiver-in-config).
TEST(InstallEnforcement, TheUsersOwnWaiverKeyIsLeftAlone) {
  Node n;
  const std::string root = kVersion3Config +
                           "[plugins.'io.containerd.nri.v1.nri'.default_validator]\n"
                           "  tolerate_missing_plugins_annotation = 'example.com/static'\n";
  n.dir.write("host/etc/containerd/config.toml", root);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.3.4";
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::nri;
  auto report = run_install(opt, n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_NE(slurp(n.host / "etc/containerd/config.toml")
                .find("tolerate_missing_plugins_annotation = 'example.com/static'"),
            std::string::npos);
  EXPECT_EQ(slurp(n.host / kDropIn).find("tolerate"), std::string::npos);
  EXPECT_EQ(n.containerd->nri.tolerate_annotation, "example.com/static");
  EXPECT_EQ(render_install_report(report).find("takes out the waiver"), std::string::npos);
}

// containerd 2.1 (NRI v0.8): no validators, so no fence link and no required_plugins; the
// report says so.
TEST(InstallEnforcement, BelowContainerd22ThereIsNoFence) {
  Node n;
  n.dir.write("host/etc/containerd/config.toml", kVersion3Config);
  n.start_containerd("/etc/containerd/config.toml");
  n.containerd->release = "v2.1.4";
  auto opt = n.options();
  opt.enforcement = EnforcementRequest::nri;
  auto report = run_install(opt, n.env());
  ASSERT_TRUE(report.ok()) << render_install_report(report);
  EXPECT_TRUE(fs::is_symlink(n.host / "opt/nri/plugins/10-gpufence-nri"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(n.host / "opt/nri/plugins/20-gpufence-fence")));
  EXPECT_EQ(slurp(n.host / kDropIn).find("required_plugins"), std::string::npos);
  auto state = parse_install_state(slurp(n.host / "etc/gpufence/install-state.json"), "state");
  ASSERT_TRUE(state);
  EXPECT_EQ(state->nri_fence_link, "");
  EXPECT_NE(render_install_report(report).find(
                "no gpufence-fence either (containerd has no validators before 2.2)"),
            std::string::npos)
      << render_install_report(report);
}

}  // namespace
}  // namespace gpufence
