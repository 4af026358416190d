// A test Kubernetes API server: no API server can be installed here, so this serves fixed JSON
// answers for GET paths, and versioned objects for PUT (409 on a stale resourceVersion), over plain
// HTTP on loopback (the client's TLS setup is not exercised), with the API's own Status body on
// errors. Unknown paths get 404 as the real one does.
#pragma once

#include <map>

#include <mutex>
#include <nlohmann/json.hpp>
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
  // An object PUT can replace: a PUT whose metadata.resourceVersion is stale gets 409, as the
  // API server answers; a good one bumps the version.
  void set_versioned(const std::string& path, nlohmann::json object);
  nlohmann::json object(const std::string& path);
  // The next PUT finds the object changed by someone else first (its write gets 409).
  void race_next_put() { m_race = true; }
  // The next PUT is answered with this status (e.g. 503) and changes nothing.
  void fail_next_put(int status) { m_fail_put = status; }
  int puts() const { return m_puts; }
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
  std::map<std::string, nlohmann::json> m_objects;
  bool m_race = false;
  int m_fail_put = 0;
  int m_puts = 0;
  std::thread m_thread;
};

}  // namespace gpufence::test
