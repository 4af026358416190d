// /healthz under a flood of the metrics port: N idle and M slow (byte-at-a-time) connections held
// open (reconnected when the server drops them, as an attacker would), while a prober asks for
// /healthz the way the kubelet does: a new connection, GET, a 1 s timeout (Kubernetes probe
// default timeoutSeconds). Prints successes, and the latency of answered probes.
//   bench_healthz_flood shared|split IDLE SLOW PROBES
// shared: one listener serves /metrics and /healthz (the earlier layout); split: /healthz
// on a listener of its own (--health-address). Built by bench/healthz_flood.sh against the
// current common/http_server.cpp (GPUFENCE_HTTP_SERVER) and against an older commit's
// deviceplugin/metrics.cpp, for the before/after table.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#ifdef GPUFENCE_HTTP_SERVER
#include "common/http_server.hpp"
#else
#include "deviceplugin/metrics.hpp"
#endif

using namespace std::chrono;

namespace {

// The listener as it is now (common/http_server.hpp) or as it was (deviceplugin/metrics.hpp's
// MetricsServer): the same start, so the two builds differ only in the listener.
#ifdef GPUFENCE_HTTP_SERVER
using Server = gpufence::HttpServer;
bool start(Server& s, std::function<std::string()> metrics, std::function<bool()> healthy) {
  return s.start("127.0.0.1:0", {std::move(metrics), std::move(healthy), "unhealthy"}).has_value();
}
#else
using Server = gpufence::MetricsServer;
bool start(Server& s, std::function<std::string()> metrics, std::function<bool()> healthy) {
  return s.start("127.0.0.1:0", std::move(metrics), std::move(healthy)).has_value();
}
#endif

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

// A connection the server closed reads 0 (or an error) without blocking.
bool closed_by_peer(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// One kubelet-style probe: connect, GET /healthz, the status line within `timeout`.
bool probe(int port, milliseconds timeout, double& seconds) {
  auto start = steady_clock::now();
  auto deadline = start + timeout;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", in;
  bool sent = false;
  while (steady_clock::now() < deadline) {
    int left =
        static_cast<int>(duration_cast<milliseconds>(deadline - steady_clock::now()).count());
    pollfd p{fd, static_cast<short>(sent ? POLLIN : POLLOUT), 0};
    if (::poll(&p, 1, std::max(left, 1)) <= 0) continue;
    if (!sent) {
      if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
        break;
      sent = true;
      continue;
    }
    char buf[512];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (in.find("\r\n") != std::string::npos) break;
  }
  ::close(fd);
  seconds = duration<double>(steady_clock::now() - start).count();
  return in.starts_with("HTTP/1.0 200") || in.starts_with("HTTP/1.1 200");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s shared|split IDLE SLOW PROBES\n", argv[0]);
    return 2;
  }
  std::string mode = argv[1];
  int idle = std::atoi(argv[2]), slow = std::atoi(argv[3]), probes = std::atoi(argv[4]);
  auto render = [] { return std::string(4096, '#') + "\n"; };  // about a real scrape's size
  Server metrics, health;
  if (mode == "shared") {
    if (!start(metrics, render, [] { return true; })) return 1;
  } else {
    if (!start(metrics, render, nullptr)) return 1;
    if (!start(health, nullptr, [] { return true; })) return 1;
  }
  int health_port = mode == "shared" ? metrics.port() : health.port();

  // The flood: keeps IDLE silent and SLOW byte-a-second connections open, reconnecting any the
  // server closes.
  std::atomic<bool> stop{false};
  std::atomic<long> reconnects{0};
  std::thread flood([&] {
    std::vector<int> idle_fds(static_cast<size_t>(idle), -1),
        slow_fds(static_cast<size_t>(slow), -1);
    auto last_byte = steady_clock::now();
    while (!stop) {
      for (auto* fds : {&idle_fds, &slow_fds}) {
        for (int& fd : *fds) {
          if (fd >= 0 && !closed_by_peer(fd)) continue;
          if (fd >= 0) {
            ::close(fd);
            ++reconnects;
          }
          fd = connect_to(metrics.port());
        }
      }
      if (steady_clock::now() - last_byte >= 1s) {
        for (int fd : slow_fds)
          if (fd >= 0) ::send(fd, "G", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        last_byte = steady_clock::now();
      }
      std::this_thread::sleep_for(20ms);
    }
    for (int fd : idle_fds)
      if (fd >= 0) ::close(fd);
    for (int fd : slow_fds)
      if (fd >= 0) ::close(fd);
  });
  std::this_thread::sleep_for(500ms);  // the flood in place

  std::vector<double> answered;
  int ok = 0;
  for (int i = 0; i < probes; ++i) {
    double s = 0;
    if (probe(health_port, 1000ms, s)) {
      ++ok;
      answered.push_back(s);
    }
    std::this_thread::sleep_for(100ms);
  }
  stop = true;
  flood.join();
  std::sort(answered.begin(), answered.end());
  auto pct = [&](double q) {
    return answered.empty()
               ? 0.0
               : answered[std::min(answered.size() - 1, static_cast<size_t>(q * answered.size()))] *
                     1e3;
  };
  std::printf(
      "%s idle=%d slow=%d: %d/%d probes answered 200 within 1 s; latency p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms; flood reconnects %ld\n",
      mode.c_str(), idle, slow, ok, probes, pct(0.5), pct(0.99),
      answered.empty() ? 0.0 : answered.back() * 1e3, reconnects.load());
  return 0;
}
