// gpufence-device-plugin, the real binary, against the test kubelet (tests/support/test_kubelet)
// and the mock NVML library, over real Unix sockets. No kubelet can be installed on this machine;
// the test kubelet behaves as the real one does (see its header).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "support/test_support.hpp"
#include "test_kubelet.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

class PluginScenario : public ::testing::Test {
 protected:
  void SetUp() override {
    m_plugin_dir = m_dir / "device-plugins";
    std::filesystem::create_directories(m_plugin_dir);
    m_events = m_dir.write("events", "");
    write_config(test::mock_gpus(2));
    m_kubelet = std::make_unique<test::TestKubelet>(m_plugin_dir);
  }
  void TearDown() override {
    m_plugin.reset();
    m_kubelet.reset();
    if (HasFailure()) {
      std::ifstream log(m_dir / "plugin.log");
      std::cerr << "---- plugin log ----\n" << log.rdbuf() << "\n";
    }
  }
  void write_config(nlohmann::json cfg) {
    cfg["events_file"] = m_events.string();
    m_config = m_dir.write("nvml.json", cfg.dump());
  }
  void start_plugin(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {test::bin_path("gpufence-device-plugin"),
                                     "--plugin-dir",
                                     m_plugin_dir.string(),
                                     "--log-level",
                                     "debug",
                                     "--metrics-address",
                                     "127.0.0.1:0"};
    // Never the host's /var/run/cdi: each test's spec goes to its own directory.
    if (std::find(extra.begin(), extra.end(), "--cdi-spec-dir") == extra.end()) {
      argv.push_back("--cdi-spec-dir");
      argv.push_back(cdi_dir().string());
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    m_plugin = std::make_unique<test::Subprocess>(
        argv,
        std::vector<std::string>{"MOCK_NVML_CONFIG=" + m_config.string(),
                                 "GPUFENCE_NVML_LIBRARY=" + test::mock_nvml_library()},
        (m_dir / "plugin.log").string());
  }
  std::filesystem::path cdi_dir() const { return m_dir / "var-run-cdi"; }
  std::filesystem::path cdi_spec() const { return cdi_dir() / "gpufence.io-gpu.json"; }
  bool wait_file(const std::filesystem::path& path, std::chrono::milliseconds timeout = 5s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(path)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }
  void inject(const std::string& line) { std::ofstream(m_events, std::ios::app) << line << "\n"; }
  // The health monitor has registered for the GPUs' events: NVML (and the mock) deliver no XID
  // that came before, so a test injects XIDs only after this.
  bool watching_events() { return log_has("event=plugin.health_events_registered gpus=2", 15s); }
  bool all_healthy(size_t n) {
    return m_kubelet->wait_devices(
        [&](const auto& d) {
          if (d.size() != n) return false;
          for (const auto& [id, h] : d)
            if (h != "Healthy") return false;
          return true;
        },
        15s);  // the plugin's start included, on a loaded machine
  }
  std::string health_of(const std::string& id) {
    auto d = m_kubelet->devices();
    return d.contains(id) ? d[id] : "";
  }
  std::string log_text() {
    std::ifstream in(m_dir / "plugin.log");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
  // The plugin logs after it acts, so a line may land just after the effect the test saw.
  bool log_has(const std::string& needle, std::chrono::milliseconds timeout = 5s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (log_text().find(needle) != std::string::npos) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
  }
  // A TCP connection to the plugin's /metrics port (from its log), or -1.
  int connect_metrics() { return connect_logged("plugin.metrics"); }
  // A TCP connection to the port the plugin logged with `event`, or -1.
  int connect_logged(const std::string& event) {
    std::smatch m;
    std::string log;
    for (int i = 0; i < 100; ++i) {
      log = log_text();
      if (std::regex_search(log, m, std::regex("event=" + event + " .*port=(\\d+)"))) break;
      std::this_thread::sleep_for(20ms);
    }
    if (m.empty()) return -1;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(m[1])));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  // /healthz answers 200 once Register has returned to the plugin, which can be just after the
  // kubelet already saw its devices; poll for it (bounded well below the server's per-client
  // deadline, so a blocked server still fails).
  bool healthz_ok(std::chrono::milliseconds timeout = 5s,
                  const std::string& event = "plugin.metrics") {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (http_get("/healthz", event).find("200 OK") != std::string::npos) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
  }
  std::string http_get(const std::string& path, const std::string& event = "plugin.metrics") {
    int fd = connect_logged(event);
    if (fd < 0) return "";
    std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
    [[maybe_unused]] auto w = ::write(fd, req.data(), req.size());
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out;
  }

  test::TempDir m_dir;
  std::filesystem::path m_plugin_dir, m_events, m_config;
  std::unique_ptr<test::TestKubelet> m_kubelet;
  std::unique_ptr<test::Subprocess> m_plugin;
};

}  // namespace

TEST_F(PluginScenario, RegistersAndAdvertisesEveryGpuWithItsNumaNode) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 10s));
  auto reg = m_kubelet->last_registration();
  EXPECT_EQ(reg.version(), "v1beta1");
  EXPECT_EQ(reg.resource_name(), "nvidia.com/gpu");
  EXPECT_EQ(reg.endpoint(), "gpufence-nvidia-gpu.sock");
  EXPECT_TRUE(reg.options().get_preferred_allocation_available());
  ASSERT_TRUE(all_healthy(2));
  auto numa = m_kubelet->numa_nodes();
  EXPECT_EQ(numa[test::mock_uuid(0)], (std::vector<long>{0}));
  EXPECT_EQ(numa[test::mock_uuid(1)], (std::vector<long>{1}));
  EXPECT_TRUE(log_has("event=plugin.registered resource=nvidia.com/gpu"));
}

TEST_F(PluginScenario, TwoContainersEachGetOneOfTwoGpusDisjointly) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));
  v1beta1::ContainerAllocateResponse a, b;
  std::vector<std::string> ida, idb;
  ASSERT_TRUE(m_kubelet->admit(1, &a, &ida).ok());
  ASSERT_TRUE(m_kubelet->admit(1, &b, &idb).ok());
  ASSERT_EQ(ida.size(), 1u);
  ASSERT_EQ(idb.size(), 1u);
  EXPECT_NE(ida[0], idb[0]);
  // Each answer names only its own GPU, through every default channel.
  auto gpu_nodes = [](const v1beta1::ContainerAllocateResponse& r) {
    std::vector<std::string> out;
    for (const auto& d : r.devices())
      if (d.container_path() != "/dev/nvidiactl") out.push_back(d.container_path());
    return out;
  };
  EXPECT_EQ(gpu_nodes(a).size(), 1u);
  EXPECT_EQ(gpu_nodes(b).size(), 1u);
  EXPECT_NE(gpu_nodes(a), gpu_nodes(b));
  ASSERT_EQ(a.mounts_size(), 1);
  EXPECT_EQ(a.mounts(0).container_path(), "/var/run/nvidia-container-devices/" + ida[0]);
  EXPECT_EQ(b.mounts(0).container_path(), "/var/run/nvidia-container-devices/" + idb[0]);
  EXPECT_EQ(a.envs().at("CUDA_VISIBLE_DEVICES"), ida[0]);
  EXPECT_EQ(a.annotations().begin()->second, "gpufence.io/gpu=" + ida[0]);
  EXPECT_FALSE(m_kubelet->admit(1, nullptr).ok()) << "a third container finds no GPU left";
}

TEST_F(PluginScenario, CriticalXidMakesGpuUnhealthyAndAllocateRefusesIt) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));
  ASSERT_TRUE(watching_events());
  inject("{\"gpu\": 0, \"xid\": 13}");  // application-level: ignored
  inject("{\"gpu\": 1, \"xid\": 48}");  // double-bit ECC: critical
  // How fast is measured in bench/ (bench_plugin: XID to Unhealthy), not asserted here.
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(1)) == "Unhealthy"; }, 5s));
  EXPECT_EQ(health_of(test::mock_uuid(0)), "Healthy");
  v1beta1::AllocateResponse resp;
  auto st = m_kubelet->allocate({{test::mock_uuid(1)}}, &resp);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error_message().find(test::mock_uuid(1)), std::string::npos);
  EXPECT_NE(st.error_message().find("Unhealthy"), std::string::npos);
  EXPECT_TRUE(log_has("event=plugin.health id=" + test::mock_uuid(1) +
                      " uuid=" + test::mock_uuid(1) + " health=Unhealthy reason=\"xid 48\""));
}

TEST_F(PluginScenario, UnhealthyGpuRecoversAfterQuietPeriodAndLostGpuWhenItAnswers) {
  m_kubelet->start();
  start_plugin({"--health-recovery", "1s"});
  ASSERT_TRUE(all_healthy(2));
  ASSERT_TRUE(watching_events());
  inject("{\"gpu\": 0, \"xid\": 48}");
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(0)) == "Unhealthy"; }, 5s));
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(0)) == "Healthy"; }, 5s));
  inject("{\"gpu\": 1, \"lost\": true}");
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(1)) == "Unhealthy"; }, 5s));
  EXPECT_EQ(health_of(test::mock_uuid(0)), "Healthy") << "only the lost GPU";
  inject("{\"gpu\": 1, \"lost\": false}");
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(1)) == "Healthy"; }, 5s));
  v1beta1::AllocateResponse resp;
  EXPECT_TRUE(m_kubelet->allocate({{test::mock_uuid(1)}}, &resp).ok());
}

// The health policy as the kubelet sees it through ListAndWatch: XID 79 (fallen off the bus) stays
// Unhealthy whatever --health-recovery says; XIDs 13, 31, 43, counted as critical when
// --ignore-xids says so, make a GPU Unhealthy and then Healthy after the quiet period; the
// driver's recovery action holds a GPU until it says none; /metrics shows each transition.
TEST_F(PluginScenario, HealthPolicyXid79StaysApplicationXidsRecoverTheActionHolds) {
  auto cfg = test::mock_gpus(2);
  cfg["gpus"][1]["recovery_action"] = 0;
  write_config(cfg);
  m_kubelet->start();
  start_plugin({"--health-recovery", "1s", "--ignore-xids", ""});
  ASSERT_TRUE(all_healthy(2));
  ASSERT_TRUE(watching_events());
  inject("{\"gpu\": 0, \"xid\": 79}");
  inject("{\"gpu\": 1, \"xid\": 13}");
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) {
        return d.at(test::mock_uuid(0)) == "Unhealthy" && d.at(test::mock_uuid(1)) == "Unhealthy";
      },
      5s));
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(1)) == "Healthy"; }, 5s));
  std::this_thread::sleep_for(1500ms);  // past the quiet period of GPU 0's XID
  EXPECT_EQ(health_of(test::mock_uuid(0)), "Unhealthy") << "XID 79 stays";
  inject("{\"gpu\": 1, \"recovery_action\": 2}");
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(1)) == "Unhealthy"; }, 5s));
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(health_of(test::mock_uuid(1)), "Unhealthy") << "held while the driver asks a reboot";
  inject("{\"gpu\": 1, \"recovery_action\": 0}");
  ASSERT_TRUE(m_kubelet->wait_devices(
      [&](const auto& d) { return d.at(test::mock_uuid(1)) == "Healthy"; }, 5s));
  EXPECT_TRUE(log_has("event=plugin.health_transition uuid=" + test::mock_uuid(1)));
  EXPECT_TRUE(log_has("reason=\"recovery action node_reboot\""));
}

TEST_F(PluginScenario, DisabledHealthChecksIgnoreXids) {
  m_kubelet->start();
  start_plugin({"--disable-health-checks"});
  ASSERT_TRUE(all_healthy(2));
  inject("{\"gpu\": 0, \"xid\": 79}");
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(health_of(test::mock_uuid(0)), "Healthy");
}

TEST_F(PluginScenario, ReRegistersAfterTwentyKubeletRestartsInARow) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 10s));
  for (int i = 1; i <= 20; ++i) {
    m_kubelet->stop();
    m_kubelet->start();
    ASSERT_TRUE(m_kubelet->wait_registrations(i + 1, 5s)) << "restart " << i;
  }
  ASSERT_TRUE(all_healthy(2));
  v1beta1::ContainerAllocateResponse r;
  EXPECT_TRUE(m_kubelet->admit(1, &r).ok());
  EXPECT_TRUE(std::filesystem::exists(m_plugin_dir / "gpufence-nvidia-gpu.sock"));
  auto metrics = http_get("/metrics");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      metrics, m,
      std::regex("gpufence_registrations_total\\{resource=\"nvidia.com/gpu\"\\} (\\d+)")));
  EXPECT_GE(std::stoi(m[1]), 21);
}

TEST_F(PluginScenario, WaitsForAKubeletStartedAfterIt) {
  start_plugin();
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(m_plugin->running()) << "no kubelet yet: the plugin waits";
  EXPECT_EQ(m_kubelet->registrations(), 0);
  m_kubelet->start();
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 5s));
  EXPECT_TRUE(all_healthy(2));
}

TEST_F(PluginScenario, BadIdsAreRefusedByNameAndNothingIsPartial) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));
  v1beta1::AllocateResponse resp;
  auto st = m_kubelet->allocate({{test::mock_uuid(0)}, {"GPU-nope"}}, &resp);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("unknown device 'GPU-nope'"), std::string::npos);
  EXPECT_EQ(resp.container_responses_size(), 0);
  std::vector<std::string> out;
  EXPECT_FALSE(m_kubelet->preferred({test::mock_uuid(0)}, {}, 2, &out).ok());
}

TEST_F(PluginScenario, IndexIdsStillCarryUuidsToTheRuntime) {
  m_kubelet->start();
  start_plugin({"--device-id-strategy", "index"});
  ASSERT_TRUE(all_healthy(2));
  EXPECT_TRUE(m_kubelet->devices().contains("1"));
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(m_kubelet->allocate({{"1"}}, &resp).ok());
  EXPECT_EQ(resp.container_responses(0).mounts(0).container_path(),
            "/var/run/nvidia-container-devices/" + test::mock_uuid(1));
}

TEST_F(PluginScenario, SigtermEndsPromptlyWhileTheKubeletHoldsTheStreamAndRemovesTheSocket) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));  // ListAndWatch stream open
  ASSERT_TRUE(std::filesystem::exists(m_plugin_dir / "gpufence-nvidia-gpu.sock"));
  int code = m_plugin->signal_and_wait(SIGTERM, 5s);  // bounded wait; speed is in bench/
  EXPECT_EQ(code, 0);
  EXPECT_FALSE(std::filesystem::exists(m_plugin_dir / "gpufence-nvidia-gpu.sock"));
}

TEST_F(PluginScenario, MetricsAndHealthz) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));
  v1beta1::ContainerAllocateResponse r;
  ASSERT_TRUE(m_kubelet->admit(1, &r).ok());
  auto metrics = http_get("/metrics");
  EXPECT_NE(metrics.find("HTTP/1.0 200 OK"), std::string::npos);
  EXPECT_NE(metrics.find("gpufence_devices{resource=\"nvidia.com/gpu\",health=\"Healthy\"} 2"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("gpufence_allocations_total{resource=\"nvidia.com/gpu\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("gpufence_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 1"),
            std::string::npos);
  EXPECT_TRUE(healthz_ok());
  EXPECT_NE(http_get("/nope").find("404"), std::string::npos);
}

TEST_F(PluginScenario, WithoutNvmlItExitsWithAClearError) {
  test::Subprocess p({test::bin_path("gpufence-device-plugin"), "--plugin-dir",
                      m_plugin_dir.string(), "--nvml-library", "/nonexistent/libnvidia-ml.so.1"},
                     {}, (m_dir / "plugin.log").string());
  EXPECT_EQ(p.signal_and_wait(0, 5s), 2);
  EXPECT_TRUE(log_has("cannot load NVML library /nonexistent/libnvidia-ml.so.1"));
}

TEST_F(PluginScenario, BadFlagsAreRejected) {
  auto r = test::run_command(
      {test::bin_path("gpufence-device-plugin"), "--device-list-strategy", "volumes"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown device list strategy 'volumes'"), std::string::npos) << r.err;
}

// ---- A hung NVML (docs/deviceplugin.md, "A hung NVML") ----

namespace {

// Without an event stream the monitor asks each GPU nvmlDeviceGetUUID twice a second: the path
// a hung driver takes (docs/deviceplugin.md).
nlohmann::json polling_config() {
  auto cfg = test::mock_gpus(2);
  cfg["fail"] = {{"nvmlEventSetWait_v2", 999}};
  return cfg;
}

bool both(const test::TestKubelet::Devices& d, const std::string& health) {
  return d.size() == 2 && d.at(test::mock_uuid(0)) == health && d.at(test::mock_uuid(1)) == health;
}

}  // namespace

TEST_F(PluginScenario, HungNvmlCallMarksGpusUnhealthyButNeverBlocksAllocateRegistrationOrSigterm) {
  write_config(polling_config());
  m_kubelet->start();
  start_plugin({"--nvml-timeout", "500ms"});
  ASSERT_TRUE(all_healthy(2));
  inject("{\"hang\": \"nvmlDeviceGetUUID\"}");
  ASSERT_TRUE(m_kubelet->wait_devices([](const auto& d) { return both(d, "Unhealthy"); }, 5s))
      << "a GPU whose liveness call misses the deadline becomes Unhealthy";
  EXPECT_TRUE(log_has("did not return within 500 ms"));

  // Allocate answers (a refusal naming the reason), it does not wait for NVML.
  v1beta1::AllocateResponse resp;
  auto st = m_kubelet->allocate({{test::mock_uuid(0)}}, &resp);
  EXPECT_NE(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(st.error_message().find("Unhealthy"), std::string::npos) << st.error_message();

  // A kubelet restart: registration and the device list go through while NVML still hangs.
  m_kubelet->stop();
  m_kubelet->start();
  ASSERT_TRUE(m_kubelet->wait_registrations(2, 5s));
  EXPECT_TRUE(m_kubelet->wait_devices([](const auto& d) { return both(d, "Unhealthy"); }, 5s));

  // SIGTERM ends it although a thread is stuck in NVML; the socket is cleaned up first.
  EXPECT_EQ(m_plugin->signal_and_wait(SIGTERM, 3s), 0);
  EXPECT_FALSE(std::filesystem::exists(m_plugin_dir / "gpufence-nvidia-gpu.sock"));
  EXPECT_TRUE(log_has("event=plugin.nvml_abandoned"));
}

TEST_F(PluginScenario, GpusRecoverWhenTheHungCallReturns) {
  write_config(polling_config());
  m_kubelet->start();
  start_plugin({"--nvml-timeout", "300ms"});
  ASSERT_TRUE(all_healthy(2));
  inject("{\"hang\": \"nvmlDeviceGetUUID\"}");
  ASSERT_TRUE(m_kubelet->wait_devices([](const auto& d) { return both(d, "Unhealthy"); }, 5s));
  inject("{\"release\": \"nvmlDeviceGetUUID\"}");
  ASSERT_TRUE(m_kubelet->wait_devices([](const auto& d) { return both(d, "Healthy"); }, 5s));
  v1beta1::AllocateResponse resp;
  EXPECT_TRUE(m_kubelet->allocate({{test::mock_uuid(1)}}, &resp).ok());
  EXPECT_EQ(m_plugin->signal_and_wait(SIGTERM, 3s), 0);
}

TEST_F(PluginScenario, AHungEventWaitMarksEveryGpuUnhealthyAndSigtermStillEndsIt) {
  m_kubelet->start();
  start_plugin({"--nvml-timeout", "300ms"});
  ASSERT_TRUE(all_healthy(2));
  inject("{\"hang\": \"nvmlEventSetWait_v2\"}");
  // No GPU can be shown to answer while NVML is stuck (NVIDIA's plugin, too, marks every device
  // on a failed wait).
  ASSERT_TRUE(m_kubelet->wait_devices([](const auto& d) { return both(d, "Unhealthy"); }, 5s));
  EXPECT_EQ(m_plugin->signal_and_wait(SIGTERM, 3s), 0);
  EXPECT_FALSE(std::filesystem::exists(m_plugin_dir / "gpufence-nvidia-gpu.sock"));
}

TEST_F(PluginScenario, SigtermDuringAHungStartUpEndsThePlugin) {
  auto cfg = test::mock_gpus(2);
  cfg["hang"] = {"nvmlDeviceGetCount_v2"};
  write_config(cfg);
  start_plugin();
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(m_plugin->running());
  EXPECT_EQ(m_plugin->signal_and_wait(SIGTERM, 3s), 0);
}

TEST_F(PluginScenario, HungStartUpFailsWithAClearError) {
  auto cfg = test::mock_gpus(2);
  cfg["hang"] = {"nvmlDeviceGetCount_v2"};
  write_config(cfg);
  start_plugin({"--nvml-timeout", "200ms"});
  EXPECT_EQ(m_plugin->signal_and_wait(0, 10s), 2);
  EXPECT_TRUE(
      log_has("discover GPUs: nvmlDeviceGetCount_v2 and the GPU queries did not "
              "return within 1200 ms"));
}

TEST_F(PluginScenario, EventRegistrationFailuresAreLoggedPerGpu) {
  auto cfg = test::mock_gpus(2);
  cfg["fail"] = {{"nvmlDeviceRegisterEvents", 3}};
  write_config(cfg);
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));
  for (unsigned i = 0; i < 2; ++i) {
    std::string line = "event=plugin.gpu_events_unregistered uuid=" + test::mock_uuid(i) +
                       " error=\"nvmlDeviceRegisterEvents " + test::mock_uuid(i) +
                       ": Not Supported (NVML error 3)\"";
    bool seen = false;
    for (int t = 0; t < 100 && !seen; ++t) {
      seen = log_text().find(line) != std::string::npos;
      if (!seen) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(seen) << line;
  }
}

// ---- The plugin directory ----

TEST_F(PluginScenario, RecreatedPluginDirectoryIsWatchedAgain) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 10s));
  m_kubelet->stop();
  std::filesystem::remove_all(m_plugin_dir);  // as some kubelet restarts do
  std::filesystem::create_directories(m_plugin_dir);
  m_kubelet->start();
  ASSERT_TRUE(m_kubelet->wait_registrations(2, 5s));
  // The watch is on the new directory: a later kubelet restart is still seen.
  std::this_thread::sleep_for(300ms);  // the old watch's last events drained
  int before = m_kubelet->registrations();
  m_kubelet->stop();
  m_kubelet->start();
  ASSERT_TRUE(m_kubelet->wait_registrations(before + 1, 5s));
  EXPECT_TRUE(all_healthy(2));
  EXPECT_TRUE(std::filesystem::exists(m_plugin_dir / "gpufence-nvidia-gpu.sock"));
  EXPECT_TRUE(log_has("event=plugin.dir_removed"));
}

TEST_F(PluginScenario, RegistersAgainWhenNoStreamIsOpenForTheConfiguredTime) {
  m_kubelet->start();
  start_plugin({"--reregister-after", "1s"});
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 10s));
  ASSERT_TRUE(all_healthy(2));
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(m_kubelet->registrations(), 1) << "an open stream is left alone";
  m_kubelet->drop_stream();
  ASSERT_TRUE(m_kubelet->wait_registrations(2, 15s));
  EXPECT_TRUE(all_healthy(2));
  EXPECT_TRUE(log_has("event=plugin.no_stream"));
}

// ---- --host-root ----

TEST_F(PluginScenario, HostRootChangesWhereItLooksNotWhatItAnswers) {
  auto root = m_dir / "host";
  std::filesystem::create_directories(root / "dev");
  if (::mknod((root / "dev/nvidiactl").c_str(), S_IFCHR | 0666, makedev(195, 255)) != 0 ||
      ::mknod((root / "dev/nvidia-uvm").c_str(), S_IFCHR | 0666, makedev(511, 0)) != 0) {
    GTEST_SKIP() << "mknod needs root: " << std::strerror(errno);
  }
  m_kubelet->start();
  start_plugin({"--host-root", root.string()});
  ASSERT_TRUE(all_healthy(2));
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(m_kubelet->allocate({{test::mock_uuid(1)}}, &resp).ok());
  std::map<std::string, std::string> specs;
  for (const auto& d : resp.container_responses(0).devices())
    specs[d.container_path()] = d.host_path();
  EXPECT_EQ(specs, (std::map<std::string, std::string>{{"/dev/nvidia1", "/dev/nvidia1"},
                                                       {"/dev/nvidiactl", "/dev/nvidiactl"},
                                                       {"/dev/nvidia-uvm", "/dev/nvidia-uvm"}}))
      << "control nodes found under the root, named by their host paths";
}

// ---- /metrics and /healthz ----

TEST_F(PluginScenario, HealthzAnswersWhileAnotherClientSendsNothing) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(all_healthy(2));
  int idle = connect_metrics();  // a scraper that connected and went quiet
  ASSERT_GE(idle, 0);
  EXPECT_TRUE(healthz_ok());
  // The probe was answered while the idle client was still connected, not after it was dropped.
  char c;
  ssize_t n = ::recv(idle, &c, 1, MSG_DONTWAIT);
  int err = errno;
  EXPECT_EQ(n, -1) << "the idle connection was closed before /healthz was answered";
  EXPECT_EQ(err, EAGAIN);
  ::close(idle);
}

// A flood of the metrics port (idle connections and byte-at-a-time clients, more
// than the listener's client slots) does not reach liveness, which has a listener of its own. The
// bound is generous (10 s, the old per-client deadline): this asserts an answer, not a latency.
TEST_F(PluginScenario, HealthzOnItsOwnListenerAnswersWhileMetricsIsFlooded) {
  m_kubelet->start();
  start_plugin({"--health-address", "127.0.0.1:0"});
  ASSERT_TRUE(all_healthy(2));
  ASSERT_TRUE(healthz_ok(5s, "plugin.health")) << "no /healthz on the health listener";
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    int fd = connect_metrics();  // idle: connects, sends nothing
    ASSERT_GE(fd, 0) << "connection " << i;
    flood.push_back(fd);
  }
  for (int i = 0; i < 50; ++i) {
    int fd = connect_metrics();  // slow: one byte of a request, then nothing
    ASSERT_GE(fd, 0);
    [[maybe_unused]] auto w = ::write(fd, "G", 1);
    flood.push_back(fd);
  }
  auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(healthz_ok(10s, "plugin.health")) << "liveness did not answer under the flood";
  std::cerr << "/healthz under a 250-connection flood: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s\n";
  // The metrics listener no longer answers liveness: a probe left on it would see 404, not 200.
  EXPECT_NE(http_get("/healthz").find("404"), std::string::npos);
  for (int fd : flood) ::close(fd);
  EXPECT_NE(http_get("/metrics").find("200 OK"), std::string::npos) << "metrics after the flood";
}

// containerd 2.x (CDI on by default) and 1.7 with enable_cdi resolve the plugin's cdi.k8s.io
// annotation themselves and fail CreateContainer when no spec defines the name: the plugin's own
// spec must be there once it has registered, valid, and define every name Allocate sends. Its
// kind is gpufence's own, so NVIDIA's toolkit's nvidia.com/gpu spec in the same directory cannot
// cancel its names, and the file an older plugin left there (kind nvidia.com/gpu) is removed.
TEST_F(PluginScenario, WritesAValidCdiSpecDefiningEveryNameAllocateSends) {
  std::filesystem::create_directories(cdi_dir());
  const auto legacy = cdi_dir() / "gpufence-nvidia.com-gpu.json";
  std::ofstream(legacy) << R"({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []})";
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 10s));
  ASSERT_TRUE(wait_file(cdi_spec())) << "no " << cdi_spec();
  auto validate = test::run_command({test::bin_path("gpufence"), "cdi", "validate", cdi_spec()});
  EXPECT_EQ(validate.exit_code, 0) << validate.out << validate.err;
  EXPECT_NE(validate.out.find("valid: " + cdi_spec().string()), std::string::npos) << validate.out;
  EXPECT_NE(validate.out.find("kind gpufence.io/gpu"), std::string::npos) << validate.out;
  auto spec = nlohmann::json::parse(std::ifstream(cdi_spec()));
  std::set<std::string> names;
  for (const auto& d : spec["devices"]) names.insert(d["name"].get<std::string>());
  for (int i = 0; i < 2; ++i) {
    v1beta1::ContainerAllocateResponse r;
    ASSERT_TRUE(m_kubelet->admit(1, &r).ok());
    ASSERT_EQ(r.annotations_size(), 1);
    const std::string value = r.annotations().begin()->second;  // "gpufence.io/gpu=<uuid>"
    ASSERT_TRUE(value.starts_with("gpufence.io/gpu=")) << value;
    EXPECT_TRUE(names.contains(value.substr(std::string("gpufence.io/gpu=").size()))) << value;
  }
  EXPECT_TRUE(log_has("event=plugin.cdi_spec path=" + cdi_spec().string()));
  EXPECT_FALSE(std::filesystem::exists(legacy)) << "the old kind's file is left beside the new";
  EXPECT_TRUE(log_has("event=plugin.cdi_spec_legacy_removed"));
}

// Removed while the plugin runs (a tmpfs /var/run cleared, a user's cleanup): back at the next
// registration, so a kubelet restart restores it. A clean stop leaves it: containers of pods
// already admitted may be (re)created while the plugin is down and still need it.
TEST_F(PluginScenario, RestoresARemovedCdiSpecAtRegistrationAndLeavesItOnStop) {
  m_kubelet->start();
  start_plugin();
  ASSERT_TRUE(m_kubelet->wait_registrations(1, 10s));
  ASSERT_TRUE(wait_file(cdi_spec()));
  std::filesystem::remove(cdi_spec());
  m_kubelet->stop();
  m_kubelet->start();
  ASSERT_TRUE(m_kubelet->wait_registrations(2, 10s));
  EXPECT_TRUE(wait_file(cdi_spec())) << "not rewritten after re-registration";
  EXPECT_EQ(m_plugin->signal_and_wait(SIGTERM, 5s), 0);
  EXPECT_TRUE(std::filesystem::exists(cdi_spec()));
}

// "" from a shell, "off" from a manifest (where --cdi-spec-dir= is no value at all).
TEST_F(PluginScenario, AnEmptyOrOffCdiSpecDirWritesNoSpecAndSaysWhatThatMeans) {
  m_kubelet->start();
  for (const std::string off : {"", "off"}) {
    start_plugin({"--cdi-spec-dir", off});
    ASSERT_TRUE(m_kubelet->wait_registrations(off.empty() ? 1 : 2, 10s)) << off;
    EXPECT_TRUE(log_has("event=plugin.cdi_spec_off")) << off;
    EXPECT_EQ(m_plugin->signal_and_wait(SIGTERM, 5s), 0);
    EXPECT_FALSE(std::filesystem::exists(cdi_dir())) << off;
    EXPECT_FALSE(std::filesystem::exists(m_dir / "off")) << "'off' taken as a directory";
    std::filesystem::remove(m_dir / "plugin.log");
  }
}

TEST_F(PluginScenario, AnUnwritableCdiSpecDirStopsStartUpNamingTheFlag) {
  m_dir.write("var-run-cdi", "a file, not a directory");
  m_kubelet->start();
  start_plugin();
  for (int i = 0; i < 250 && m_plugin->running(); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(m_plugin->signal_and_wait(0, 2s), 2);
  EXPECT_NE(log_text().find("--cdi-spec-dir"), std::string::npos) << log_text();
  EXPECT_EQ(m_kubelet->registrations(), 0);
}
