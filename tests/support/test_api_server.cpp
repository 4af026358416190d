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

void TestApiServer::set_versioned(const std::string& path, nlohmann::json object) {
  std::lock_guard lock(m_mu);
  object["metadata"]["resourceVersion"] = "1";
  m_objects[path] = std::move(object);
}

nlohmann::json TestApiServer::object(const std::string& path) {
  std::lock_guard lock(m_mu);
  return m_objects[path];
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
    // The body, by Content-Length.
    size_t header_end = req.find("\r\n\r\n");
    size_t length = 0;
    if (auto cl = req.find("Content-Length: "); cl != std::string::npos && cl < header_end) {
      length = std::stoul(req.substr(cl + 16));
    }
    while (header_end != std::string::npos && req.size() < header_end + 4 + length) {
      ssize_t n = ::recv(conn, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string method = req.substr(0, req.find(' '));
    std::string path;
    if (method.size() < req.size()) {
      path = req.substr(method.size() + 1, req.find(' ', method.size() + 1) - method.size() - 1);
    }
    std::string body = header_end == std::string::npos ? "" : req.substr(header_end + 4);
    Answer a{
        404,
        R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404})"};
    {
      std::lock_guard lock(m_mu);
      if (auto it = m_answers.find(path); it != m_answers.end()) a = it->second;
      if (auto obj = m_objects.find(path); obj != m_objects.end()) {
        a = {200, obj->second.dump()};
        if (method == "PUT") {
          ++m_puts;
          auto bump = [](nlohmann::json& o) {
            o["metadata"]["resourceVersion"] =
                std::to_string(std::stol(o["metadata"]["resourceVersion"].get<std::string>()) + 1);
          };
          if (m_race) {
            bump(obj->second);
            m_race = false;
          }
          nlohmann::json sent = nlohmann::json::parse(body, nullptr, false);
          if (m_fail_put) {
            a = {m_fail_put,
                 R"({"kind":"Status","message":"etcdserver: request timed out","code":)" +
                     std::to_string(m_fail_put) + "}"};
            m_fail_put = 0;
          } else if (sent.is_discarded() || sent["metadata"]["resourceVersion"] !=
                                                obj->second["metadata"]["resourceVersion"]) {
            a = {
                409,
                R"({"kind":"Status","reason":"Conflict","message":"the object has been modified; please apply your changes to the latest version and try again","code":409})"};
          } else {
            obj->second = sent;
            bump(obj->second);
            a = {200, obj->second.dump()};
          }
        }
      }
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
