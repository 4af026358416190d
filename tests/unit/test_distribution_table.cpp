// The one table of where each Kubernetes distribution keeps containerd's and the kubelet's files:
// its rows are what docs/install.md says (with the upstream sources), the Helm chart's
// per-distribution paths are the table's, detection finds k0s, and the doctor's defaults come
// from it (on rke2 the doctor judged containerd's built-in defaults before).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>

#include "distribution/distribution.hpp"
#include "doctor/gather.hpp"
#include "install/layout.hpp"
#include "support/test_support.hpp"

using namespace gpufence;

namespace {

// What docs/install.md's "Distributions" table says, row by row.
struct Documented {
  std::string name, config_input, config_read, socket, state, kubelet;
};
const Documented kDocumented[] = {
    {"containerd", "/etc/containerd/config.toml", "/etc/containerd/config.toml",
     "/run/containerd/containerd.sock", "/run/containerd", "/var/lib/kubelet"},
    {"microk8s", "/var/snap/microk8s/current/args/containerd-template.toml",
     "/var/snap/microk8s/current/args/containerd.toml",
     "/var/snap/microk8s/common/run/containerd.sock", "/var/snap/microk8s/common/run/containerd",
     "/var/snap/microk8s/common/var/lib/kubelet"},
    {"k3s", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl",
     "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "/run/k3s/containerd/containerd.sock",
     "/run/k3s/containerd", "/var/lib/kubelet"},
    {"rke2", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl",
     "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
     "/run/k3s/containerd/containerd.sock", "/run/k3s/containerd", "/var/lib/kubelet"},
    {"k0s", "/etc/k0s/containerd.d/gpufence.toml", "/etc/k0s/containerd.toml",
     "/run/k0s/containerd.sock", "/run/k0s/containerd", "/var/lib/k0s/kubelet"},
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The chart's `gpufence.distributions` define: YAML between the define and its end.
YAML::Node chart_distributions() {
  std::string text =
      slurp(std::string(GPUFENCE_SOURCE_DIR) + "/deploy/helm/gpufence/templates/_helpers.tpl");
  const std::string open = "{{- define \"gpufence.distributions\" -}}";
  auto begin = text.find(open);
  if (begin == std::string::npos) return {};
  begin += open.size();
  auto end = text.find("{{- end -}}", begin);
  if (end == std::string::npos) return {};
  return YAML::Load(text.substr(begin, end - begin));
}

}  // namespace

TEST(DistributionTable, EachRowIsWhatTheDocsSay) {
  std::set<std::string> seen;
  for (const auto& d : kDocumented) {
    auto id = parse_distribution(d.name);
    ASSERT_TRUE(id) << d.name;
    const DistributionRow& row = distribution_row(*id);
    EXPECT_EQ(row.name, d.name);
    EXPECT_EQ(row.config_input, d.config_input) << d.name;
    EXPECT_EQ(row.config_read, d.config_read) << d.name;
    EXPECT_EQ(row.socket, d.socket) << d.name;
    EXPECT_EQ(row.state_dir, d.state) << d.name;
    EXPECT_EQ(row.kubelet_root, d.kubelet) << d.name;
    EXPECT_EQ(device_plugin_dir(), "/var/lib/kubelet/device-plugins");  // whatever --root-dir
    EXPECT_EQ(pod_resources_socket(row), d.kubelet + "/pod-resources/kubelet.sock");
    EXPECT_EQ(task_dir(row), d.state + "/io.containerd.runtime.v2.task");
    seen.insert(d.name);
  }
  // Every row is documented, once.
  EXPECT_EQ(distribution_table().size(), std::size(kDocumented));
  for (const auto& row : distribution_table()) EXPECT_TRUE(seen.contains(std::string(row.name)));
  EXPECT_FALSE(parse_distribution("kubeadm"));
  EXPECT_NE(parse_distribution("kubeadm").error().message.find("k0s"), std::string::npos);
}

TEST(DistributionTable, HowEachConfigIsWrittenAndRestarted) {
  EXPECT_EQ(distribution_row(Distribution::containerd).config_source, ConfigSource::file);
  EXPECT_EQ(distribution_row(Distribution::microk8s).config_source, ConfigSource::template_file);
  EXPECT_EQ(distribution_row(Distribution::k3s).config_source, ConfigSource::go_template);
  EXPECT_EQ(distribution_row(Distribution::rke2).config_source, ConfigSource::go_template);
  EXPECT_EQ(distribution_row(Distribution::k0s).config_source, ConfigSource::drop_in_dir);
  test::TempDir d;
  HostFs host(d.path());
  auto k0s = distribution_row(Distribution::k0s);
  EXPECT_EQ(restart_command(k0s, host),
            (std::vector<std::string>{"systemctl", "restart", "k0scontroller"}));
  d.write("etc/systemd/system/k0sworker.service", "");
  EXPECT_EQ(restart_command(k0s, host),
            (std::vector<std::string>{"systemctl", "restart", "k0sworker"}));
}

// The chart's per-distribution values are the table's: the same distributions, and for each its
// kubelet directory, the containerd config install edits, and the socket it verifies on.
TEST(DistributionTable, TheHelmChartHasTheTablesPaths) {
  YAML::Node chart = chart_distributions();
  ASSERT_TRUE(chart.IsMap()) << "no gpufence.distributions define in _helpers.tpl";
  std::set<std::string> chart_names;
  for (const auto& kv : chart) chart_names.insert(kv.first.as<std::string>());
  std::set<std::string> table_names;
  for (const auto& row : distribution_table()) table_names.emplace(row.name);
  EXPECT_EQ(chart_names, table_names);
  for (const auto& row : distribution_table()) {
    YAML::Node d = chart[std::string(row.name)];
    if (!d) continue;
    EXPECT_EQ(d["kubeletDir"].as<std::string>(""), row.kubelet_root) << row.name;
    EXPECT_EQ(d["containerdConfig"].as<std::string>(""), row.config_input) << row.name;
    EXPECT_EQ(d["containerdSocket"].as<std::string>(""), row.socket) << row.name;
    // Install writes every distribution's config (k0s: its own drop-in): the chart's node
    // installer runs on each.
    EXPECT_TRUE(d["installer"].as<bool>(true)) << row.name;
  }
}

TEST(DistributionTable, DetectsK0s) {
  for (std::string marker : {"etc/k0s/containerd.toml", "etc/k0s/containerd.d/gvisor.toml"}) {
    test::TempDir d;
    d.write(marker, "");
    d.write("run/containerd/containerd.sock", "");  // a plain containerd beside it loses
    std::vector<std::string> notes;
    auto got = detect_distribution(HostFs(d.path()), notes);
    ASSERT_TRUE(got) << marker;
    EXPECT_EQ(*got, Distribution::k0s) << marker;
    ASSERT_FALSE(notes.empty());
    EXPECT_NE(notes.back().find("also found /run/containerd/containerd.sock"), std::string::npos);
  }
  test::TempDir d;
  auto layout = layout_for(Distribution::k0s, HostFs(d.path()));
  EXPECT_EQ(layout.socket, "/run/k0s/containerd.sock");
  EXPECT_EQ(layout.kubelet_dir, "/var/lib/k0s/kubelet");
}

// On an rke2 node the doctor judges the config rke2's containerd reads, not containerd's
// built-in defaults (which have no GPU handler). Through the binary, as a user runs it.
namespace {
nlohmann::json doctor_json(const test::TempDir& root) {
  auto r = test::run_command({std::string(GPUFENCE_BIN_DIR) + "/gpufence", "--host-root",
                              root.path().string(), "doctor", "--json"});
  EXPECT_NE(r.exit_code, 2) << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << e.what() << ": " << r.out << r.err;
    return {};
  }
}
}  // namespace

TEST(DistributionTable, TheDoctorFindsEachDistributionsContainerdConfig) {
  const std::string handler =
      "version = 2\n"
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
      "  runtime_type = \"io.containerd.runc.v2\"\n"
      "  container_annotations = [\"cdi.k8s.io/*\"]\n"
      "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
      "  BinaryName = \"/usr/local/bin/gpufence-runtime\"\n";
  for (const auto& row : distribution_table()) {
    const std::string config = std::string(row.config_read).substr(1);
    {
      test::TempDir d;
      d.write("proc/.keep", "");
      d.write(config, handler);
      d.write("usr/local/bin/gpufence-runtime", "");
      auto doc = doctor_json(d);
      for (const auto& s : doc.value("skipped", nlohmann::json::array()))
        EXPECT_EQ(s.get<std::string>().find("judged containerd's defaults"), std::string::npos)
            << row.name << ": " << s;
      for (const auto& f : doc.value("findings", nlohmann::json::array()))
        EXPECT_NE(f.value("id", ""), "containerd.handler-missing") << row.name;
    }
    {
      // The file it read is the distribution's: a broken one is reported under its path.
      test::TempDir d;
      d.write("proc/.keep", "");
      d.write(config, "version = 2\n[plugins\n");
      auto doc = doctor_json(d);
      bool named = false;
      for (const auto& f : doc.value("findings", nlohmann::json::array()))
        named |= f.value("id", "") == "containerd.config-unreadable" &&
                 f.value("evidence", "").find(row.config_read) != std::string::npos;
      EXPECT_TRUE(named) << row.name << ": " << doc.dump();
    }
  }
}

// On a k0s node (containerd.toml as k0s 1.36 writes it: version 3, importing containerd.d/*.toml)
// the doctor misses the handler, `setup containerd --flavor k0s` writes gpufence's drop-in and
// leaves containerd.toml byte for byte, and the doctor then finds the handler through k0s's
// import. Through the binary. On the old code setup refused k0s.
TEST(DistributionTable, TheDoctorFindsTheHandlerSetupWroteOnK0s) {
  const std::string k0s_config =
      "# k0s_managed=true\n# This is a placeholder configuration for k0s managed containerd.\n"
      "imports = [\"/etc/k0s/containerd.d/*.toml\"]\nversion = 3\n\n[plugins]\n"
      "  [plugins.\"io.containerd.cri.v1.images\"]\n"
      "    [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n"
      "      sandbox = \"quay.io/k0sproject/pause:3.10.1\"\n"
      "  [plugins.\"io.containerd.cri.v1.runtime\"]\n";
  test::TempDir d;
  d.write("proc/.keep", "");
  d.write("etc/k0s/containerd.toml", k0s_config);
  d.write("etc/k0s/containerd.d/other.toml", "version = 3\n");
  d.write("usr/local/bin/gpufence-runtime", "");
  auto ids = [](const nlohmann::json& doc) {
    std::set<std::string> out;
    for (const auto& f : doc.value("findings", nlohmann::json::array()))
      out.insert(f.value("id", ""));
    return out;
  };
  EXPECT_TRUE(ids(doctor_json(d)).contains("containerd.handler-missing"))
      << "before setup, the doctor misses the handler";
  auto r = test::run_command({std::string(GPUFENCE_BIN_DIR) + "/gpufence", "--host-root",
                              d.path().string(), "setup", "containerd", "--flavor", "k0s",
                              "--binary", "/usr/local/bin/gpufence-runtime"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("wrote: /etc/k0s/containerd.d/gpufence.toml"), std::string::npos) << r.out;
  EXPECT_EQ(slurp((d / "etc/k0s/containerd.toml").string()), k0s_config);
  auto doc = doctor_json(d);
  auto found = ids(doc);
  EXPECT_FALSE(found.contains("containerd.handler-missing")) << doc.dump(2);
  EXPECT_FALSE(found.contains("containerd.handler-bypasses-binary")) << doc.dump(2);
  for (const auto& s : doc.value("skipped", nlohmann::json::array()))
    EXPECT_EQ(s.get<std::string>().find("judged containerd's defaults"), std::string::npos) << s;
}

// The doctor looks for the kubelet and containerd's bundles wherever any distribution keeps them.
TEST(DistributionTable, TheDoctorsDefaultsCoverEveryDistribution) {
  GatherOptions opt;
  for (const auto& row : distribution_table()) {
    auto has = [](const std::vector<std::string>& v, const std::string& x) {
      return std::find(v.begin(), v.end(), x) != v.end();
    };
    EXPECT_TRUE(has(opt.containerd_configs, std::string(row.config_read))) << row.name;
    EXPECT_TRUE(has(opt.pod_resources_sockets, pod_resources_socket(row))) << row.name;
    EXPECT_TRUE(has(opt.plugin_dirs, device_plugin_dir())) << row.name;
    EXPECT_TRUE(has(opt.task_dirs, task_dir(row))) << row.name;
  }
}
