// gpufence-device-plugin under load, measured from outside as the kubelet sees it:
// - Allocate round-trip latency over the Unix socket, p50/p99 of 10,000 calls, 8 GPUs;
// - the daemon's RSS and anonymous memory (/proc/<pid>/smaps_rollup) after start, after 1,000
//   and after 10,000 Allocates, beside a bare gRPC C++ server as the baseline;
// - time from an injected XID to the kubelet seeing the GPU Unhealthy;
// - under a hung nvmlDeviceGetUUID (the mock's hang injection): time until the kubelet sees the
//   GPUs Unhealthy, Allocate round trip, re-registration after a kubelet restart, SIGTERM to exit;
// - /healthz round trip with 31 idle clients connected to the metrics port.
// Usage: bench_plugin [CALLS]
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <regex>

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

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The plugin under a hung NVML: 2 GPUs, no event stream (the monitor polls nvmlDeviceGetUUID),
// a 1 s deadline. Prints what the kubelet sees.
int hung_nvml_phase(const test::TempDir& dir) {
  auto plugin_dir = dir / "hung-plugins";
  std::filesystem::create_directories(plugin_dir);
  auto events = dir.write("hung-events", "");
  auto cfg = test::mock_gpus(2);
  cfg["events_file"] = events.string();
  cfg["fail"] = {{"nvmlEventSetWait_v2", 999}};
  auto config = dir.write("hung-nvml.json", cfg.dump());
  test::TestKubelet kubelet(plugin_dir);
  kubelet.start();
  test::Subprocess plugin(
      {test::bin_path("gpufence-device-plugin"), "--plugin-dir", plugin_dir.string(),
       "--cdi-spec-dir", (dir / "cdi").string(), "--nvml-timeout", "1s", "--metrics-address",
       "127.0.0.1:0"},
      {"MOCK_NVML_CONFIG=" + config.string(), "GPUFENCE_NVML_LIBRARY=" + test::mock_nvml_library()},
      (dir / "hung-plugin.log").string());
  auto both = [](const test::TestKubelet::Devices& d, const char* h) {
    return d.size() == 2 && d.at(test::mock_uuid(0)) == h && d.at(test::mock_uuid(1)) == h;
  };
  if (!kubelet.wait_devices([&](const auto& d) { return both(d, "Healthy"); }, 10s)) {
    std::cerr << "hung phase: plugin did not register\n";
    return 1;
  }
  // /healthz beside 31 idle clients.
  std::smatch m;
  std::string log = slurp(dir / "hung-plugin.log");
  if (!std::regex_search(log, m, std::regex("event=plugin.metrics .*port=(\\d+)"))) return 1;
  int port = std::stoi(m[1]);
  std::vector<int> idle;
  for (int i = 0; i < 31; ++i) idle.push_back(test::connect_loopback(port));
  std::vector<double> healthz_ms;
  for (int i = 0; i < 20; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    int fd = test::connect_loopback(port);
    std::string req = "GET /healthz HTTP/1.0\r\n\r\n";
    [[maybe_unused]] auto w = ::write(fd, req.data(), req.size());
    char buf[512];
    std::string out;
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    if (out.find("200 OK") == std::string::npos) return 1;
    healthz_ms.push_back(ms_since(t0));
  }
  for (int fd : idle) ::close(fd);

  auto t_hang = std::chrono::steady_clock::now();
  std::ofstream(events, std::ios::app) << "{\"hang\": \"nvmlDeviceGetUUID\"}\n";
  if (!kubelet.wait_devices([&](const auto& d) { return both(d, "Unhealthy"); }, 10s)) {
    std::cerr << "hung phase: GPUs never became Unhealthy\n";
    return 1;
  }
  double unhealthy_ms = ms_since(t_hang);
  std::vector<double> alloc_us;
  for (int i = 0; i < 100; ++i) {
    v1beta1::AllocateResponse resp;
    auto t0 = std::chrono::steady_clock::now();
    auto st = kubelet.allocate({{test::mock_uuid(0)}}, &resp);  // refused: Unhealthy
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return 1;
    alloc_us.push_back(ms_since(t0) * 1000);
  }
  kubelet.stop();
  auto t_restart = std::chrono::steady_clock::now();
  kubelet.start();
  if (!kubelet.wait_registrations(2, 10s)) return 1;
  double rereg_ms = ms_since(t_restart);
  auto t_term = std::chrono::steady_clock::now();
  int code = plugin.signal_and_wait(SIGTERM, 10s);
  double term_ms = ms_since(t_term);
  std::printf("/healthz with 31 idle clients connected, 20 calls: median %.2f ms, max %.2f ms\n",
              percentile(healthz_ms, 0.5), percentile(healthz_ms, 1.0));
  std::printf(
      "hung nvmlDeviceGetUUID (deadline 1 s): kubelet sees both GPUs Unhealthy after %.0f ms\n",
      unhealthy_ms);
  std::printf("  Allocate round trip meanwhile, 100 calls: p50 %.0f us, max %.0f us\n",
              percentile(alloc_us, 0.5), percentile(alloc_us, 1.0));
  std::printf("  kubelet restart -> registered again: %.0f ms\n", rereg_ms);
  std::printf("  SIGTERM -> exit (code %d): %.0f ms\n", code, term_ms);
  return 0;
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
      {test::bin_path("gpufence-device-plugin"), "--plugin-dir", plugin_dir.string(),
       "--cdi-spec-dir", (dir / "cdi").string(), "--log-level", "warn", "--health-recovery",
       "300ms"},
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
  return hung_nvml_phase(dir);
}
