#include "support/fake_node.hpp"

#include <cstdio>
#include <fstream>

namespace gpufence::test {

FakeNode::FakeNode(std::filesystem::path root) : m_root(std::move(root)) {
  std::filesystem::create_directories(m_root / "proc");
  std::filesystem::create_directories(m_root / "dev");
  std::filesystem::create_directories(m_root / "proc/1/ns");
  std::filesystem::create_symlink(kHostPidNs, m_root / "proc/1/ns/pid");
}

void FakeNode::write(const std::string& rel, const std::string& content) const {
  auto p = m_root / rel;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << content;
}

void FakeNode::install_gpufence_handler() const {
  write("usr/local/bin/gpufence-runtime", "#!/bin/sh\n");
  std::filesystem::permissions(m_root / "usr/local/bin/gpufence-runtime",
                               std::filesystem::perms::owner_all);
  write("etc/containerd/config.toml",
        "version = 2\n"
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"
        "runtime_type = \"io.containerd.runc.v2\"\n"
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
        "runtime_type = \"io.containerd.runc.v2\"\n"
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
        "BinaryName = \"/usr/local/bin/gpufence-runtime\"\n");
}

std::string FakeNode::add(const FakeContainer& c) {
  char id[65];
  std::snprintf(id, sizeof id, "%064x", m_next++);
  std::string cid = id;
  std::string cg_path = "/kubepods/besteffort/pod" + c.pod + "/" + cid;
  std::string cgroup;
  switch (c.form) {
    case FakeContainer::CgroupForm::cgroupfs:
      cgroup =
          "12:pids:" + cg_path + "\n5:devices:" + cg_path + "\n1:name=systemd:" + cg_path + "\n";
      break;
    case FakeContainer::CgroupForm::systemd:
      cg_path = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + c.pod +
                ".slice/cri-containerd-" + cid + ".scope";
      cgroup = "5:devices:" + cg_path + "\n";
      break;
    case FakeContainer::CgroupForm::v2:
      cg_path = "/kubepods.slice/kubepods-besteffort.slice/cri-containerd-" + cid + ".scope";
      cgroup = "0::" + cg_path + "\n";
      break;
  }
  for (unsigned pid : c.pids) {
    std::string p = "proc/" + std::to_string(pid);
    write(p + "/cgroup", cgroup);
    write(p + "/environ", c.env);
    write(p + "/status", std::string("Name:\tapp\nCapBnd:\t") +
                             (c.has_cap_sys_admin ? "000001ffffffffff" : "00000000a80425fb") +
                             "\n" + (c.cap_eff.empty() ? "" : "CapEff:\t" + c.cap_eff + "\n"));
    if (!c.mountinfo.empty()) write(p + "/mountinfo", c.mountinfo);
    // Like the kernel's "pid:[inode]": the host's, or one per container.
    std::filesystem::create_directories(m_root / p / "ns");
    std::filesystem::remove(m_root / p / "ns/pid");
    std::filesystem::create_symlink(
        c.host_pid ? std::string(kHostPidNs) : "pid:[" + std::to_string(4026532000 + m_next) + "]",
        m_root / p / "ns/pid");
    for (unsigned m : c.dev_minors) write(p + "/root/dev/nvidia" + std::to_string(m), "");
    for (const auto& [path, content] : c.files) write(p + "/root" + path, content);
  }
  if (c.form != FakeContainer::CgroupForm::v2)
    write("sys/fs/cgroup/devices" + cg_path + "/devices.list", c.devices_list);
  std::string config =
      "{\"ociVersion\":\"1.0.2\",\"annotations\":{\"io.kubernetes.cri.sandbox-name\":\"" + c.pod +
      "\",\"io.kubernetes.cri.sandbox-namespace\":\"" + c.ns +
      "\",\"io.kubernetes.cri.container-name\":\"" + c.name +
      "\",\"io.kubernetes.cri.container-type\":\"" + c.type +
      "\"},\"linux\":{\"resources\":{\"devices\":" + c.oci_rules + "}}}";
  write("run/containerd/io.containerd.runtime.v2.task/k8s.io/" + cid + "/config.json", config);
  return cid;
}

std::vector<Gpu> fake_gpus(unsigned n) {
  std::vector<Gpu> out;
  for (unsigned i = 0; i < n; ++i) {
    Gpu g;
    g.index = i;
    g.minor = i;
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-%08x-0000-4000-8000-000000000000", i);
    g.uuid = uuid;
    g.name = "NVIDIA Test GPU";
    out.push_back(g);
  }
  return out;
}

}  // namespace gpufence::test
