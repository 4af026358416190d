#include "common/http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/strings.hpp"

namespace gpufence {

HttpServer::~HttpServer() {
  stop();
}

Status HttpServer::start(const std::string& address, Routes routes) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos)
    return fail(Errc::invalid_argument, "listen address '", address, "' must be HOST:PORT");
  std::string host = address.substr(0, colon);
  auto port = parse_number<unsigned short>(address.substr(colon + 1));
  if (!port) return fail(Errc::invalid_argument, "listen address '", address, "': bad port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(*port);
  if (host.empty() || host == "0.0.0.0")
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  else if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return fail(Errc::invalid_argument, "listen address '", address,
                "': host must be an IPv4 address");
  }
  m_listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (m_listen_fd < 0) return fail_errno("socket for", address);
  int one = 1;
  ::setsockopt(m_listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(m_listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return fail_errno("bind", address);
  // Room for a burst of connections while the thread is busy; each is accepted within a round.
  if (::listen(m_listen_fd, kBacklog) != 0) return fail_errno("listen", address);
  socklen_t len = sizeof addr;
  ::getsockname(m_listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  m_port = ntohs(addr.sin_port);
  if (::pipe2(m_stop_pipe, O_CLOEXEC) != 0) return fail_errno("pipe for", address);
  m_routes = std::move(routes);
  m_thread = std::thread([this] { serve(); });
  return {};
}

void HttpServer::stop() {
  if (m_thread.joinable()) {
    char c = 'x';
    [[maybe_unused]] auto n = ::write(m_stop_pipe[1], &c, 1);
    m_thread.join();
  }
  for (int* fd : {&m_listen_fd, &m_stop_pipe[0], &m_stop_pipe[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

namespace {

// Each client gets kRequestDeadline to send its request (an idle or byte-at-a-time one is dropped
// then) and kClientDeadline from accept to the last byte of its answer; past kMaxClients the
// oldest is dropped. The kubelet's probe sends its request at once, so it is never the oldest.
constexpr auto kRequestDeadline = HttpServer::kRequestDeadline;
constexpr auto kClientDeadline = HttpServer::kClientDeadline;
constexpr size_t kMaxClients = HttpServer::kMaxClients;
constexpr size_t kMaxRequest = 8192;

struct Client {
  int fd = -1;
  std::string in, out;
  size_t sent = 0;
  bool answering = false;
  std::chrono::steady_clock::time_point deadline;  // the request's, then the answer's
  std::chrono::steady_clock::time_point accepted;
};

bool request_complete(const std::string& in) {
  return in.find("\r\n\r\n") != std::string::npos || in.find("\n\n") != std::string::npos ||
         in.size() >= kMaxRequest;
}

}  // namespace

std::string HttpServer::answer(const std::string& request) const {
  std::string status = "404 Not Found", body = "not found\n", type = "text/plain";
  if (request.starts_with("GET /metrics") && m_routes.metrics) {
    status = "200 OK";
    body = m_routes.metrics();
    // Prometheus' text exposition format, version 0.0.4 (prometheus/docs, "Exposition formats").
    type = "text/plain; version=0.0.4";
  } else if (request.starts_with("GET /healthz") && m_routes.healthy) {
    bool ok = m_routes.healthy();
    status = ok ? "200 OK" : "503 Service Unavailable";
    body = ok ? "ok\n" : m_routes.unhealthy_reason + "\n";
  }
  return cat("HTTP/1.0 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
             "\r\nConnection: close\r\n\r\n", body);
}

// One thread, every client at once: poll over the listening socket and each connection, all
// non-blocking, so a client that connects and sends nothing (or reads slowly) delays no other.
void HttpServer::serve() {
  std::vector<Client> clients;
  auto drop = [&](size_t i) {
    ::close(clients[i].fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  };
  // Reads what the client has sent so far; a complete request gets its answer ready. False when
  // the client closed or failed.
  auto take_input = [&](Client& c) {
    char buf[2048];
    for (;;) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (!request_complete(c.in)) continue;
        c.out = answer(c.in);
        c.answering = true;
        c.deadline = c.accepted + kClientDeadline;
        return true;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  };
  // Full: make room for one more. Requests already sent are read first (the kubelet's probe sends
  // its whole request at once, so it gets its answer instead of a place in the queue); then the
  // waiting client that has sent the least is dropped, the oldest of those first: an idle or
  // byte-at-a-time connection, never a request that was complete. Dropping by age alone let a
  // burst of reconnecting idle clients push the probe out before its request was read
  // (bench/RESULTS.md, "/healthz under a flood").
  auto make_room = [&] {
    for (size_t i = clients.size(); i-- > 0;) {
      if (!clients[i].answering && !take_input(clients[i])) drop(i);
    }
    if (clients.size() < kMaxClients) return;
    size_t victim = 0;
    bool found = false;
    for (size_t i = 0; i < clients.size(); ++i) {
      if (clients[i].answering) continue;
      if (!found || clients[i].in.size() < clients[victim].in.size()) victim = i;
      found = true;
    }
    drop(victim);  // every slot answering: the oldest of those
  };
  while (true) {
    auto now = std::chrono::steady_clock::now();
    for (size_t i = clients.size(); i-- > 0;) {
      if (clients[i].deadline <= now) drop(i);
    }
    std::vector<pollfd> fds = {{m_listen_fd, POLLIN, 0}, {m_stop_pipe[0], POLLIN, 0}};
    int timeout = -1;
    for (const auto& c : clients) {
      fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
      auto left = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now).count();
      left = std::max<decltype(left)>(left, 0);
      timeout = timeout < 0 ? static_cast<int>(left) : std::min(timeout, static_cast<int>(left));
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) break;
    // Serve the connections polled this round (new ones join the next round).
    for (size_t i = clients.size(); i-- > 0;) {
      short ev = fds[i + 2].revents;
      if (!ev) continue;
      Client& c = clients[i];
      if (!c.answering) {
        if (!take_input(c)) {
          drop(i);
          continue;
        }
        if (!c.answering) continue;
      }
      ssize_t w = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (w > 0) c.sent += static_cast<size_t>(w);
      if (w <= 0 || c.sent == c.out.size()) drop(i);
    }
    if (fds[0].revents & POLLIN) {
      int conn;
      while ((conn = ::accept4(m_listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        if (clients.size() >= kMaxClients) make_room();
        auto at = std::chrono::steady_clock::now();
        clients.push_back(Client{conn, {}, {}, 0, false, at + kRequestDeadline, at});
      }
    }
  }
  for (auto& c : clients) ::close(c.fd);
}

}  // namespace gpufence
