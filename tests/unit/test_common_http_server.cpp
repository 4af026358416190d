// The HTTP listener of the device plugin and `install --watch` (common/http_server.hpp): routes a
// listener was not given are 404, and a listener of its own keeps /healthz answering while another
// is flooded.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "common/http_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;

namespace {

// One GET, its whole answer; a receive timeout bounds a server that never answers.
std::string get(int port, const std::string& path, std::chrono::seconds bound = 10s) {
  int fd = test::connect_loopback(port);
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

TEST(HttpServer, ARouteAListenerWasNotGivenIs404) {
  HttpServer metrics, health;
  ASSERT_TRUE(metrics.start("127.0.0.1:0", {[] { return std::string("m 1\n"); }, nullptr, ""}));
  ASSERT_TRUE(health.start("127.0.0.1:0", {nullptr, [] { return true; }, ""}));
  EXPECT_NE(get(metrics.port(), "/metrics").find("200 OK"), std::string::npos);
  EXPECT_NE(get(metrics.port(), "/healthz").find("404 Not Found"), std::string::npos);
  EXPECT_NE(get(health.port(), "/healthz").find("200 OK"), std::string::npos);
  EXPECT_NE(get(health.port(), "/metrics").find("404 Not Found"), std::string::npos);
}

// The 503 says what is not ready in the caller's words: the listener is the plugin's and the
// installer's, and "not registered with the kubelet" is only true of the plugin.
TEST(HttpServer, UnhealthyIs503WithTheCallersReason) {
  HttpServer health;
  std::atomic<bool> ready = false;
  ASSERT_TRUE(health.start("127.0.0.1:0", {nullptr, [&ready] { return ready.load(); }, "not yet"}));
  auto answer = get(health.port(), "/healthz");
  EXPECT_NE(answer.find("503 Service Unavailable"), std::string::npos) << answer;
  EXPECT_TRUE(answer.ends_with("\r\n\r\nnot yet\n")) << answer;
  ready = true;
  answer = get(health.port(), "/healthz");
  EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer;
  EXPECT_TRUE(answer.ends_with("\r\n\r\nok\n")) << answer;
}

TEST(HttpServer, HealthAnswersWhileTheMetricsListenerIsFlooded) {
  HttpServer metrics, health;
  ASSERT_TRUE(metrics.start("127.0.0.1:0", {[] { return std::string("m 1\n"); }, nullptr, ""}));
  ASSERT_TRUE(health.start("127.0.0.1:0", {nullptr, [] { return true; }, ""}));
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(test::connect_loopback(metrics.port()));  // idle
  for (int i = 0; i < 50; ++i) {  // byte-at-a-time, stalled after the first
    int fd = test::connect_loopback(metrics.port());
    [[maybe_unused]] auto w = ::write(fd, "G", 1);
    flood.push_back(fd);
  }
  EXPECT_NE(get(health.port(), "/healthz").find("200 OK"), std::string::npos);
  for (int fd : flood) ::close(fd);
}

// A client that sends part of a request and stops is dropped after kRequestDeadline, not held for
// the whole answer deadline.
TEST(HttpServer, AStalledRequestIsDroppedAtTheRequestDeadline) {
  HttpServer health;
  ASSERT_TRUE(health.start("127.0.0.1:0", {nullptr, [] { return true; }, ""}));
  int fd = test::connect_loopback(health.port());
  ASSERT_GE(fd, 0);
  [[maybe_unused]] auto w = ::write(fd, "GET /hea", 8);
  timeval tv{static_cast<time_t>(HttpServer::kClientDeadline.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto started = std::chrono::steady_clock::now();
  char c;
  EXPECT_EQ(::read(fd, &c, 1), 0) << "closed without an answer";
  auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, HttpServer::kClientDeadline - 1s) << "held for the whole answer deadline";
  ::close(fd);
}
