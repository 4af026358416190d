// gpufence-nri's own cost, in-process: a scripted runtime on one end of a socketpair, the real
// session and handler (the shim's decision on a fake two-GPU node) on the other. Each call is a
// full round trip: ttrpc framing, protobuf, the decision, the adjustment. Reports the median and
// p99 per CreateContainer for an unprivileged and a privileged GPU container, and the process's
// RSS after N of them (default 10,000). Needs root (mknod of the fake GPU nodes).
// Usage: bench_nri [N]
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/strings.hpp"
#include "nri/adjust.hpp"
#include "nri/handler.hpp"
#include "nri/session.hpp"
#include "ttrpc/request.pb.h"

using namespace gpufence;
using namespace gpufence::nri;

namespace {

constexpr const char* kUuid[] = {"GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01",
                                 "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2"};

void make_node_root(const std::filesystem::path& root) {
  std::filesystem::create_directories(root / "dev");
  for (unsigned i = 0; i < 2; ++i) {
    ::mknod((root / cat("dev/nvidia", i)).c_str(), S_IFCHR | 0666, makedev(195, i));
    std::string bus = cat("0000:0", i + 1, ":00.0");
    auto dir = root / "proc/driver/nvidia/gpus" / bus;
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "information")
        << "Model: \t\t Fake\nGPU UUID: \t " << kUuid[i] << "\nBus Location: \t " << bus
        << "\nDevice Minor: \t " << i << "\n";
  }
  ::mknod((root / "dev/nvidiactl").c_str(), S_IFCHR | 0666, makedev(195, 255));
  std::ofstream(root / "proc/devices")
      << "Character devices:\n  1 mem\n  4 tty\n 10 misc\n195 nvidia-frontend\n226 drm\n\n"
         "Block devices:\n  8 sd\n";
}

// Another DRA driver's claim spec (NVIDIA's layout: one transient spec per claim, names per
// claim, the GPU's node by path alone) for the listed-kind shape.
constexpr const char* kListedKind = "k8s.gpu.nvidia.com/claim";
void write_claim_spec(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "k8s.gpu.nvidia.com-claim_5e1f.json")
      << R"({"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
  "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}], "env": ["NVIDIA_VISIBLE_DEVICES=void"]},
  "devices": [{"name": "5e1f-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
              {"name": "5e1f-gpu-1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}]})";
}

api::Container container(bool privileged, int n, bool with_mounts, bool listed_claim = false) {
  api::Container c;
  c.set_id(cat("c", n));
  c.set_name("app");
  c.add_env("PATH=/bin");
  if (listed_claim)
    c.add_cdi_devices()->set_name(cat(kListedKind, "=5e1f-gpu-", n % 2));
  else
    (*c.mutable_annotations())["cdi.k8s.io/gpufence_x"] = cat("nvidia.com/gpu=", kUuid[n % 2]);
  auto* lin = c.mutable_linux();
  auto* d = lin->add_devices();
  d->set_path(cat("/dev/nvidia", n % 2));
  d->set_type("c");
  d->set_major(195);
  d->set_minor(n % 2);
  // The mounts CRI gives every container (binds of its own files, the cgroupfs, /dev/shm).
  if (with_mounts) {
    for (const char* dest :
         {"/etc/hosts", "/dev/termination-log", "/etc/hostname", "/etc/resolv.conf"}) {
      auto* m = c.add_mounts();
      m->set_destination(dest);
      m->set_type("bind");
      m->set_source("/etc/hosts");
      for (const char* o : {"rbind", "rprivate", "rw"}) m->add_options(o);
    }
    auto* cg = c.add_mounts();
    cg->set_destination("/sys/fs/cgroup");
    cg->set_type("cgroup");
    cg->set_source("cgroup");
    for (const char* o : {"nosuid", "noexec", "nodev", "relatime", "ro"}) cg->add_options(o);
  }
  auto* rule = lin->mutable_resources()->add_devices();
  rule->set_allow(privileged);
  rule->set_access("rwm");
  return c;
}

// The process's threads now (/proc/self/task).
size_t threads() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

std::string rss() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("VmRSS:")) return std::string(trim(line.substr(6)));
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  auto root = std::filesystem::temp_directory_path() / cat("gpufence-nri-bench-", ::getpid());
  make_node_root(root);
  RuntimeConfig config;
  config.device_root = root.string();
  config.procfs_gpus_dir = "/nonexistent";
  config.nri_status_file = (root / "nri-status.json").string();  // not the machine's
  config.cdi_spec_dirs = {(root / "cdi").string()};
  config.gpu_cdi_kinds = {kListedKind};
  write_claim_spec(root / "cdi");
  Logger log(LogLevel::off);
  ShimContext ctx{
      config, log,
      []() -> Result<std::unique_ptr<GpuInventory>> { return fail(Errc::nvml, "none"); },
      "/usr/local/bin/gpufence-runtime", CdiEdits::already_injected};
  GpufenceHandler handler(ctx);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  std::thread plugin([&] { (void)run_session(sv[0], SessionOptions{}, handler, log); });

  MuxReader mux;
  TtrpcReader conns[3];
  auto receive = [&](uint32_t conn) {
    char buf[65536];
    for (;;) {
      if (auto m = conns[conn].next(); m && *m) return **m;
      ssize_t r = ::read(sv[1], buf, sizeof buf);
      if (r <= 0) std::exit(1);
      mux.feed(std::string_view(buf, static_cast<size_t>(r)));
      while (auto f = mux.next()) {
        if (!*f) break;
        conns[(*f)->conn].feed((*f)->payload);
      }
    }
  };
  uint32_t stream = 1;
  auto call = [&](std::string_view method, const google::protobuf::MessageLite& payload) {
    ::ttrpc::Request r;
    r.set_service(std::string(kPluginService));
    r.set_method(std::string(method));
    r.set_payload(payload.SerializeAsString());
    TtrpcMessage m{stream, 1, 0, r.SerializeAsString()};
    stream += 2;
    auto frames = encode_ttrpc_frames(1, m).value();
    for (const auto& f : frames)
      if (::write(sv[1], f.data(), f.size()) != static_cast<ssize_t>(f.size())) std::exit(1);
    return receive(1);
  };
  receive(2);  // RegisterPlugin
  api::ConfigureRequest cfg;
  cfg.set_runtime_name("containerd");
  cfg.set_runtime_version("v2.3.4");
  cfg.set_nri_version("v0.12.0");
  call("Configure", cfg);
  call("Synchronize", api::SynchronizeRequest());

  // As gpufence-nri runs (the host's cgroup mount points kept until the mount table changes),
  // then the mounted shapes again reading /proc/self/mountinfo at every decision, as before.
  CgroupMountPoints kept;
  // Last, another DRA driver's claim by its listed kind ([cdi] gpu_kinds): its CDI spec read
  // and its GPU node stat'ed at each decision.
  struct Shape {
    bool with_mounts, privileged, keep_mount_points, listed_claim = false;
  };
  for (Shape shape : {Shape{false, false, true}, Shape{false, true, true}, Shape{true, false, true},
                      Shape{true, true, true}, Shape{true, false, false}, Shape{true, true, false},
                      Shape{false, false, true, true}, Shape{false, true, true, true}}) {
    ctx.cgroup_mounts = shape.keep_mount_points ? &kept : nullptr;
    std::vector<double> us;
    us.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      api::CreateContainerRequest req;
      *req.mutable_container() =
          container(shape.privileged, i, shape.with_mounts, shape.listed_claim);
      auto t0 = std::chrono::steady_clock::now();
      auto reply = call("CreateContainer", req);
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      ::ttrpc::Response resp;
      if (!resp.ParseFromString(reply.data) || resp.has_status()) {
        std::cerr << "CreateContainer failed: " << resp.status().message() << "\n";
        return 1;
      }
    }
    std::sort(us.begin(), us.end());
    std::printf(
        "%s GPU container%s: CreateContainer round trip median %.1f us, p99 %.1f us (n=%d); "
        "RSS after %d: %s\n",
        shape.privileged ? "privileged" : "unprivileged",
        shape.listed_claim        ? ", another DRA driver's claim (listed kind)"
        : !shape.with_mounts      ? ""
        : shape.keep_mount_points ? " with CRI's mounts"
                                  : " with CRI's mounts, mountinfo read per decision",
        us[us.size() / 2], us[us.size() * 99 / 100], n, n, rss().c_str());
  }

  // Decision time and memory against the number of mounts, up to the limit (1024) and past it
  // (refused before anything is copied): each mount is a distinct bind the decision keeps; the
  // counts are the pod's, CRI adds 5 more (1019 + 5 = 1024, the limit).
  std::printf("\nunprivileged GPU container by mount count (round trip, median of %d):\n",
              std::max(n / 50, 20));
  ctx.cgroup_mounts = &kept;
  for (int mounts : {16, 128, 512, 1019, 1020, 4096, 24000}) {  // + CRI's 5: 1019 is the limit
    const int rounds = std::max(n / 50, 20);
    std::vector<double> us;
    bool refused = false;
    for (int i = 0; i < rounds; ++i) {
      api::CreateContainerRequest req;
      *req.mutable_container() = container(false, i, true);
      for (int k = 0; k < mounts; ++k) {
        auto* m = req.mutable_container()->add_mounts();
        m->set_destination(cat("/data/v", k));
        m->set_type("bind");
        m->set_source("/tmp");
        for (const char* o : {"rbind", "rprivate", "rw"}) m->add_options(o);
      }
      auto t0 = std::chrono::steady_clock::now();
      auto reply = call("CreateContainer", req);
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      ::ttrpc::Response resp;
      refused = !resp.ParseFromString(reply.data) || resp.has_status();
    }
    std::sort(us.begin(), us.end());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::printf("  %5d mounts: %s, median %.1f us (%.2f us per mount); RSS %s, threads %zu\n",
                mounts, refused ? "refused (over the limit)" : "decided", us[us.size() / 2],
                us[us.size() / 2] / mounts, rss().c_str(), threads());
  }
  ::close(sv[1]);
  plugin.join();
  ::close(sv[0]);
  std::filesystem::remove_all(root);
  return 0;
}
