// gpufence-device-plugin under load, measured from outside as the kubelet sees it:
// - Allocate round-trip latency over the Unix socket, p50/p99 of 10,000 calls, 8 GPUs;
// - the daemon's RSS and anonymous memory (/proc/<pid>/smaps_rollup) after start, after 1,000
//   and after 10,000 Allocates, beside a bare gRPC C++ server as the baseline;
// - time from an injected XID to the kubelet seeing the GPU Unhealthy.
// Usage: bench_plugin [CALLS]
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iostream>

#include "support/test_support.hpp"
#include "test_kubelet.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

struct Memory {
  long rss_kb = -1, anon_kb = -1;
};

Memory smaps_rollup(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  Memory m;
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("Rss:")) m.rss_kb = std::stol(line.substr(4));
    if (line.starts_with("Anonymous:")) m.anon_kb = std::stol(line.substr(10));
  }
  return m;
}

std::string mib(long kb) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", kb / 1024.0);
  return buf;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  int calls = argc > 1 ? std::stoi(argv[1]) : 10000;
  test::TempDir dir;
  auto plugin_dir = dir / "device-plugins";
  std::filesystem::create_directories(plugin_dir);
  auto events = dir.write("events", "");
  auto cfg = test::mock_gpus(8);
  cfg["events_file"] = events.string();
  auto config = dir.write("nvml.json", cfg.dump());

  // Baseline process first, measured idle.
  test::Subprocess bare({test::bin_path("bench_bare_grpc_server"), (dir / "bare.sock").string()},
                        {}, (dir / "bare.log").string());
  test::TestKubelet kubelet(plugin_dir);
  kubelet.start();
  test::Subprocess plugin(
      {test::bin_path("gpufence-device-plugin"), "--plugin-dir", plugin_dir.string(), "--log-level",
       "warn", "--health-recovery", "300ms"},
      {"MOCK_NVML_CONFIG=" + config.string(), "GPUFENCE_NVML_LIBRARY=" + test::mock_nvml_library()},
      (dir / "plugin.log").string());
  if (!kubelet.wait_registrations(1, 10s) ||
      !kubelet.wait_devices([](const auto& d) { return d.size() == 8; }, 10s)) {
    std::cerr << "plugin did not register\n";
    return 1;
  }
  std::this_thread::sleep_for(200ms);
  Memory bare_mem = smaps_rollup(bare.pid());
  Memory start = smaps_rollup(plugin.pid());

  std::vector<double> us;
  us.reserve(static_cast<size_t>(calls));
  Memory after_1k, after_10k;
  for (int i = 0; i < calls; ++i) {
    v1beta1::AllocateResponse resp;
    auto t0 = std::chrono::steady_clock::now();
    auto st = kubelet.allocate({{test::mock_uuid(static_cast<unsigned>(i % 8))}}, &resp);
    auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) {
      std::cerr << "Allocate failed: " << st.error_message() << "\n";
      return 1;
    }
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (i + 1 == 1000) after_1k = smaps_rollup(plugin.pid());
    if (i + 1 == 10000) after_10k = smaps_rollup(plugin.pid());
  }
  Memory after_all = smaps_rollup(plugin.pid());

  // XID -> Unhealthy in the kubelet's view, 10 times (recovery 300 ms between samples).
  std::vector<double> xid_ms;
  for (int i = 0; i < 10; ++i) {
    std::string uuid = test::mock_uuid(static_cast<unsigned>(i % 8));
    kubelet.wait_devices([&](const auto& d) { return d.at(uuid) == "Healthy"; }, 5s);
    auto t0 = std::chrono::steady_clock::now();
    std::ofstream(events, std::ios::app) << "{\"gpu\": \"" << uuid << "\", \"xid\": 79}\n";
    if (!kubelet.wait_devices([&](const auto& d) { return d.at(uuid) == "Unhealthy"; }, 5s)) {
      std::cerr << "XID never reached the kubelet\n";
      return 1;
    }
    xid_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  plugin.signal_and_wait(SIGTERM, 5s);
  bare.signal_and_wait(SIGTERM, 5s);

  std::printf("Allocate round trip, %d calls, 8 GPUs: p50 %.1f us, p99 %.1f us, max %.1f us\n",
              calls, percentile(us, 0.50), percentile(us, 0.99), percentile(us, 1.0));
  std::printf("memory (smaps_rollup)        RSS         Anonymous\n");
  std::printf("  bare gRPC server, idle     %-11s %s\n", mib(bare_mem.rss_kb).c_str(),
              mib(bare_mem.anon_kb).c_str());
  std::printf("  plugin after start         %-11s %s\n", mib(start.rss_kb).c_str(),
              mib(start.anon_kb).c_str());
  std::printf("  plugin after 1,000 calls   %-11s %s\n", mib(after_1k.rss_kb).c_str(),
              mib(after_1k.anon_kb).c_str());
  if (calls > 10000) {
    std::printf("  plugin after 10,000 calls  %-11s %s\n", mib(after_10k.rss_kb).c_str(),
                mib(after_10k.anon_kb).c_str());
  }
  std::printf("  plugin after %d calls  %-11s %s\n", calls, mib(after_all.rss_kb).c_str(),
              mib(after_all.anon_kb).c_str());
  std::printf("XID injected -> kubelet sees Unhealthy, 10 samples: median %.0f ms, max %.0f ms\n",
              percentile(xid_ms, 0.5), percentile(xid_ms, 1.0));
  return 0;
}
