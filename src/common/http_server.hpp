// A small HTTP/1.0 listener for GET /metrics and GET /healthz, shared by the device plugin and
// `gpufence install --watch`. It knows nothing of either: each gives it the two routes' answers.
// Here, not in deviceplugin/, so `gpufence` serves /healthz without linking the plugin.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>

#include "common/error.hpp"

namespace gpufence {

// One TCP address ("127.0.0.1:9400", ":9400"), on its own thread, serving many clients at once.
// Either route may be left out (null: 404), so liveness gets a listener of its own: a flood of the
// metrics port (idle or byte-at-a-time clients) fills only that listener's client slots, and the
// kubelet's probe still finds a free socket, thread and slots on the health port
// (docs/deviceplugin.md, "/metrics and /healthz"). Every connection is bounded: kRequestDeadline
// to send its request, kClientDeadline to the last byte of the answer, kMaxClients at once (past
// that, the waiting client that has sent the least is dropped, after every request already sent
// has been read).
class HttpServer {
 public:
  using Render = std::function<std::string()>;
  struct Routes {
    Render metrics;                 // GET /metrics: 200 with this text; null: 404
    std::function<bool()> healthy;  // GET /healthz: 200 "ok" or 503; null: 404
    std::string unhealthy_reason;   // the 503's body: what is not ready, in the caller's words
  };
  static constexpr auto kRequestDeadline = std::chrono::seconds(2);
  static constexpr auto kClientDeadline = std::chrono::seconds(10);
  static constexpr size_t kMaxClients = 32;
  static constexpr int kBacklog = 128;

  HttpServer() = default;
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  Status start(const std::string& address, Routes routes);
  void stop();
  int port() const { return m_port; }

 private:
  void serve();
  std::string answer(const std::string& request) const;
  int m_listen_fd = -1;
  int m_stop_pipe[2] = {-1, -1};
  int m_port = 0;
  Routes m_routes;
  std::thread m_thread;
};

}  // namespace gpufence
