// Reading containerd's answer to CRI Status (verbose): info["config"], as containerd 1.6.20
// printed it here (trimmed to the fields read), and malformed answers.
#include <gtest/gtest.h>

#include "install/runner.hpp"
#include "install/state.hpp"

namespace gpufence {
namespace {

TEST(InstallCri, ReadsRuntimesAndBinaryNames) {
  auto got = parse_cri_config_runtimes(R"({
    "containerd": {"snapshotter": "overlayfs", "defaultRuntimeName": "runc",
      "runtimes": {
        "nvidia": {"runtimeType": "io.containerd.runc.v2", "runtimePath": "",
                   "PodAnnotations": ["cdi.k8s.io/*", 7], "ContainerAnnotations": null,
                   "options": {"BinaryName": "/usr/local/bin/gpufence-runtime", "SystemdCgroup": false}},
        "runc": {"runtimeType": "io.containerd.runc.v2", "options": {"BinaryName": ""}},
        "kata": {"runtimeType": "io.containerd.kata.v2", "options": null}}},
    "sandboxImage": "registry.k8s.io/pause:3.6"})");
  ASSERT_TRUE(got) << got.error().message;
  ASSERT_EQ(got->size(), 3u);
  std::map<std::string, LoadedRuntime> by_name;
  for (const auto& r : *got) by_name[r.name] = r;
  EXPECT_EQ(by_name["nvidia"].binary_name, "/usr/local/bin/gpufence-runtime");
  EXPECT_EQ(by_name["nvidia"].pod_annotations, std::vector<std::string>{"cdi.k8s.io/*"});
  EXPECT_EQ(by_name["nvidia"].runtime_path, "");
  EXPECT_EQ(by_name["runc"].binary_name, "");
  EXPECT_EQ(by_name["kata"].runtime_type, "io.containerd.kata.v2");
  EXPECT_FALSE(by_name["kata"].binary_name);
}

TEST(InstallCri, MalformedAnswersNameWhatIsMissing) {
  EXPECT_NE(parse_cri_config_runtimes("not json").error().message.find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(parse_cri_config_runtimes("{}").error().message.find("no \"containerd\""),
            std::string::npos);
  EXPECT_NE(parse_cri_config_runtimes(R"({"containerd": {"runtimes": []}})")
                .error()
                .message.find("containerd.runtimes"),
            std::string::npos);
}

TEST(InstallCri, HostCommandPrefixesOnlyForNsenter) {
  std::vector<std::string> cmd = {"snap", "restart", "microk8s.daemon-containerd"};
  EXPECT_EQ(host_command(HostExec::direct, cmd), cmd);
  auto ns = host_command(HostExec::nsenter, cmd);
  ASSERT_EQ(ns.size(), 12u);
  EXPECT_EQ(ns[0], "nsenter");
  EXPECT_EQ(ns[8], "--");
  EXPECT_EQ(ns[9], "snap");
}

TEST(InstallState, RoundTripsAndRejectsMissingFields) {
  InstallState s;
  s.distribution = "microk8s";
  s.runtime_name = "nvidia";
  s.socket = "/var/snap/microk8s/common/run/containerd.sock";
  s.restart = {"snap", "restart", "microk8s.daemon-containerd"};
  s.config_path = "/var/snap/microk8s/current/args/containerd-template.toml";
  s.config_changed = true;
  s.config_files = {
      {s.config_path, true, s.config_path + ".bak-20260101T000000Z", {"version = 2\n"}},
      {"/etc/containerd/conf.d/99-gpufence.toml", false, "", {"version = 3\n", "version = 3\n#"}}};
  s.cdi_spec = InstallState::ManagedFile{"/etc/cdi/nvidia.yaml", false, "", {"cdiVersion"}};
  s.phase = "installing";
  s.steps = {"journal", "runtime binary"};
  s.created_dirs = {"/etc/gpufence"};
  s.binary_link = "/usr/local/bin/gpufence-runtime";
  s.versions_dir = "/usr/local/lib/gpufence";
  auto back = parse_install_state(install_state_to_json(s), "state.json");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(install_state_to_json(*back), install_state_to_json(s));
  EXPECT_FALSE(back->runtime_config_path);
  EXPECT_EQ(back->phase, "installing");
  EXPECT_EQ(back->config_files[1].written.size(), 2u);
  InstallState bad_phase = s;
  bad_phase.phase = "half";
  EXPECT_FALSE(parse_install_state(install_state_to_json(bad_phase), "state.json"));
  auto bad = parse_install_state(R"({"distribution": "k3s"})", "/etc/gpufence/install-state.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("/etc/gpufence/install-state.json"), std::string::npos);

  // A record that says the config changed must say which files, and a file that existed needs
  // the backup uninstall restores it from: without them uninstall would have nothing to act on.
  InstallState no_files = s;
  no_files.config_files.clear();
  auto r1 = parse_install_state(install_state_to_json(no_files), "state.json");
  ASSERT_FALSE(r1);
  EXPECT_NE(r1.error().message.find("config.changed without config.files"), std::string::npos)
      << r1.error().message;
  InstallState no_backup = s;
  no_backup.config_files[0].backup.clear();
  auto r2 = parse_install_state(install_state_to_json(no_backup), "state.json");
  ASSERT_FALSE(r2);
  EXPECT_NE(r2.error().message.find("a backup if it existed"), std::string::npos)
      << r2.error().message;
}

}  // namespace
}  // namespace gpufence
