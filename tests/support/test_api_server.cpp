#include "support/test_api_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace gpufence::test {

TestApiServer::TestApiServer() {
  m_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(m_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::listen(m_fd, 16);
  socklen_t len = sizeof addr;
  ::getsockname(m_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  m_port = ntohs(addr.sin_port);
  [[maybe_unused]] int rc = ::pipe(m_stop);
  m_thread = std::thread([this] { serve(); });
}

TestApiServer::~TestApiServer() {
  char c = 'x';
  [[maybe_unused]] auto n = ::write(m_stop[1], &c, 1);
  m_thread.join();
  ::close(m_fd);
  ::close(m_stop[0]);
  ::close(m_stop[1]);
}

void TestApiServer::set(const std::string& path, int status, const std::string& body) {
  std::lock_guard lock(m_mu);
  m_answers[path] = {status, body};
}

std::string TestApiServer::kubeconfig(const std::string& token) const {
  return "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: c\n  cluster:\n  "
         "  server: " +
         url() +
         "\ncontexts:\n- name: test\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  "
         "user:\n    token: " +
         token + "\n";
}

void TestApiServer::serve() {
  while (true) {
    pollfd fds[2] = {{m_fd, POLLIN, 0}, {m_stop[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents) return;
    int conn = ::accept(m_fd, nullptr, nullptr);
    if (conn < 0) continue;
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(conn, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string path;
    if (req.starts_with("GET ")) path = req.substr(4, req.find(' ', 4) - 4);
    Answer a{
        404,
        R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404})"};
    {
      std::lock_guard lock(m_mu);
      if (auto it = m_answers.find(path); it != m_answers.end()) a = it->second;
    }
    std::string resp =
        "HTTP/1.1 " + std::to_string(a.status) +
        " X\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(a.body.size()) +
        "\r\nConnection: close\r\n\r\n" + a.body;
    ::send(conn, resp.data(), resp.size(), MSG_NOSIGNAL);
    ::close(conn);
  }
}

}  // namespace gpufence::test
