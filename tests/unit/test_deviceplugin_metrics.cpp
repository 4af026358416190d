// The plugin's HTTP listeners (deviceplugin/metrics.hpp): routes a listener was not given are 404,
// and a listener of its own keeps /healthz answering while another is flooded (issue 16, item 9).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "deviceplugin/metrics.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One GET, its whole answer; a receive timeout bounds a server that never answers.
std::string get(int port, const std::string& path, std::chrono::seconds bound = 10s) {
  int fd = connect_to(port);
  if (fd < 0) return "";
  timeval tv{static_cast<time_t>(bound.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  [[maybe_unused]] auto w = ::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace

TEST(PluginHttp, ARouteAListenerWasNotGivenIs404) {
  MetricsServer metrics, health;
  ASSERT_TRUE(metrics.start(
      "127.0.0.1:0", [] { return std::string("m 1\n"); }, nullptr));
  ASSERT_TRUE(health.start("127.0.0.1:0", nullptr, [] { return true; }));
  EXPECT_NE(get(metrics.port(), "/metrics").find("200 OK"), std::string::npos);
  EXPECT_NE(get(metrics.port(), "/healthz").find("404 Not Found"), std::string::npos);
  EXPECT_NE(get(health.port(), "/healthz").find("200 OK"), std::string::npos);
  EXPECT_NE(get(health.port(), "/metrics").find("404 Not Found"), std::string::npos);
}

TEST(PluginHttp, HealthAnswersWhileTheMetricsListenerIsFlooded) {
  MetricsServer metrics, health;
  ASSERT_TRUE(metrics.start(
      "127.0.0.1:0", [] { return std::string("m 1\n"); }, nullptr));
  ASSERT_TRUE(health.start("127.0.0.1:0", nullptr, [] { return true; }));
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(connect_to(metrics.port()));  // idle
  for (int i = 0; i < 50; ++i) {  // byte-at-a-time, stalled after the first
    int fd = connect_to(metrics.port());
    [[maybe_unused]] auto w = ::write(fd, "G", 1);
    flood.push_back(fd);
  }
  EXPECT_NE(get(health.port(), "/healthz").find("200 OK"), std::string::npos);
  for (int fd : flood) ::close(fd);
}

// A client that sends part of a request and stops is dropped after kRequestDeadline, not held for
// the whole answer deadline.
TEST(PluginHttp, AStalledRequestIsDroppedAtTheRequestDeadline) {
  MetricsServer health;
  ASSERT_TRUE(health.start("127.0.0.1:0", nullptr, [] { return true; }));
  int fd = connect_to(health.port());
  ASSERT_GE(fd, 0);
  [[maybe_unused]] auto w = ::write(fd, "GET /hea", 8);
  timeval tv{static_cast<time_t>(MetricsServer::kClientDeadline.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto started = std::chrono::steady_clock::now();
  char c;
  EXPECT_EQ(::read(fd, &c, 1), 0) << "closed without an answer";
  auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, MetricsServer::kClientDeadline - 1s) << "held for the whole answer deadline";
  ::close(fd);
}
