// A test Kubernetes API server: no API server can be installed here, so this serves fixed JSON
// answers for GET paths over plain HTTP on loopback (the client's TLS setup is not exercised),
// with the API's own Status body on errors. Unknown paths get 404 as the real one does.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace gpufence::test {

class TestApiServer {
 public:
  struct Answer {
    int status = 200;
    std::string body;
  };
  TestApiServer();
  ~TestApiServer();
  void set(const std::string& path, int status, const std::string& body);
  std::string url() const { return "http://127.0.0.1:" + std::to_string(m_port); }
  // A kubeconfig (written to `path`) whose current context points at this server.
  std::string kubeconfig(const std::string& token = "test-token") const;

 private:
  void serve();
  int m_fd = -1;
  int m_port = 0;
  int m_stop[2] = {-1, -1};
  std::mutex m_mu;
  std::map<std::string, Answer> m_answers;
  std::thread m_thread;
};

}  // namespace gpufence::test
