#include "nri/session.hpp"

#include <malloc.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/strings.hpp"

namespace gpufence::nri {
namespace {

Status write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno("write", "the NRI socket");
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

Status send_message(int fd, ConnId conn, const TtrpcMessage& message) {
  auto frames = encode_ttrpc_frames(static_cast<uint32_t>(conn), message);
  if (!frames) return std::unexpected(frames.error());
  for (const auto& f : *frames)
    if (auto st = write_all(fd, f); !st) return st;
  return {};
}

}  // namespace

Result<int> connect_nri_socket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    return fail(Errc::invalid_argument, "NRI socket path too long: ", path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail_errno("socket for", path);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    auto err = fail_errno("connect", path);
    ::close(fd);
    return std::unexpected(err.error());
  }
  return fd;
}

Status run_session(int fd, const SessionOptions& options, PluginHandler& handler, Logger& log) {
  MuxReader mux;
  TtrpcReader plugin_conn, runtime_conn;
  // 1. Register at once: the runtime gives a plugin 5 s (plugin_registration_timeout).
  if (auto st = send_message(fd, ConnId::runtime_service,
                             register_request(1, options.name, options.index));
      !st)
    return st;
  bool registered = false;
  std::string buf(64 * 1024, '\0');
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno("read", "the NRI socket");
    }
    if (n == 0) return {};  // the runtime closed (or restarted): the caller reconnects
    const auto received = std::chrono::steady_clock::now();
    mux.feed(std::string_view(buf.data(), static_cast<size_t>(n)));
    for (;;) {
      auto frame = mux.next();
      if (!frame) return std::unexpected(frame.error());
      if (!*frame) break;
      // Frames for a conn nobody opened are dropped, as the Go mux does (mux.go reader).
      if ((*frame)->conn == static_cast<uint32_t>(ConnId::plugin_service))
        plugin_conn.feed((*frame)->payload);
      else if ((*frame)->conn == static_cast<uint32_t>(ConnId::runtime_service))
        runtime_conn.feed((*frame)->payload);
    }
    // 2. The runtime's calls, answered in order.
    size_t largest = 0;
    for (;;) {
      auto message = plugin_conn.next();
      if (!message) return std::unexpected(message.error());
      if (!*message) break;
      largest = std::max(largest, (*message)->data.size());
      if ((*message)->type != static_cast<uint8_t>(TtrpcType::request))
        return fail(Errc::parse, "runtime sent ttrpc type ", +(*message)->type,
                    " on the plugin's service");
      (*message)->received = received;
      auto reply = answer_request(**message, handler);
      if (auto st = send_message(fd, ConnId::plugin_service, reply); !st) return st;
    }
    // After a request of megabytes (a container near or over the limits) the heap gives its
    // pages back: one such pod must not leave the plugin that every pod waits on holding them.
    if (largest > (1u << 20)) ::malloc_trim(0);
    // 3. The answer to RegisterPlugin, the one call this plugin makes.
    for (;;) {
      auto message = runtime_conn.next();
      if (!message) return std::unexpected(message.error());
      if (!*message) break;
      if ((*message)->stream != 1 || registered)
        return fail(Errc::parse, "unexpected ttrpc message on stream ", (*message)->stream);
      if (auto st = read_call_response(**message); !st)
        return std::unexpected(st.error().wrap("RegisterPlugin"));
      registered = true;
      log.info("nri.registered", {{"name", options.name}, {"index", options.index}});
    }
  }
}

}  // namespace gpufence::nri
