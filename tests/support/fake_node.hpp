// A fake node tree for the doctor: /proc entries, cgroup files, OCI bundles where containerd
// keeps them, device nodes, containerd config, and an in-process GpuInventory. Shared by the
// doctor's tests and its benchmark.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gpu.hpp"

namespace gpufence::test {

class FakeInventory final : public GpuInventory {
 public:
  std::vector<Gpu> list;
  std::map<std::string, std::vector<GpuProcess>> procs;
  Result<std::vector<Gpu>> gpus() override { return list; }
  Result<std::vector<GpuProcess>> processes(const std::string& uuid) override {
    return procs[uuid];
  }
  Result<Topology> topology(const std::string&, const std::string&) override { return Topology{}; }
  Status check_alive(const std::string&) override { return {}; }
  Result<std::optional<GpuEvent>> wait_event(std::chrono::milliseconds) override {
    return std::optional<GpuEvent>{};
  }
};

struct FakeContainer {
  std::string pod, ns = "default", name = "main";
  std::string type = "container";  // io.kubernetes.cri.container-type: container or sandbox
  std::vector<unsigned> pids;
  std::string env;                           // NUL-separated environ
  bool has_cap_sys_admin = false;            // CapBnd with CAP_SYS_ADMIN, as a privileged pod's
  std::vector<unsigned> dev_minors;          // /dev/nvidiaN in its root
  std::string devices_list = "c 1:3 rwm\n";  // v1 devices.list
  std::string oci_rules = "[{\"allow\":false,\"access\":\"rwm\"}]";
  std::map<std::string, std::string> files;  // extra files in its root (path -> content)
  bool host_pid = false;  // /proc/<pid>/ns/pid is PID 1's (else a namespace of its own)
  std::string cap_eff;    // CapEff in /proc/<pid>/status, hex; "" writes no CapEff line
  std::string mountinfo;  // /proc/<pid>/mountinfo; "" writes none
  enum class CgroupForm { cgroupfs, systemd, v2 } form = CgroupForm::cgroupfs;
};

class FakeNode {
 public:
  explicit FakeNode(std::filesystem::path root);
  // Adds a container and returns its 64-hex id.
  std::string add(const FakeContainer& c);
  void write(const std::string& rel, const std::string& content) const;
  // /usr/local/bin/gpufence-runtime and an /etc/containerd/config.toml whose "nvidia" handler
  // runs it: a node where containerd is set up right.
  void install_gpufence_handler() const;
  const std::filesystem::path& root() const { return m_root; }

 private:
  std::filesystem::path m_root;
  int m_next = 1;
};

// /proc/1/ns/pid of a FakeNode: the host's PID namespace.
inline constexpr const char* kHostPidNs = "pid:[4026531836]";

// GPUs 0..n-1 with minors 0..n-1 and UUIDs GPU-0000000N-....
std::vector<Gpu> fake_gpus(unsigned n);

}  // namespace gpufence::test
