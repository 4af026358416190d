// NRI's two framings, written from upstream's wire facts (docs/nri.md):
// - the connection multiplexer (nri@v0.12.0:pkg/net/multiplex/mux.go): every frame on the Unix
//   socket is ConnID:uint32 BE | PayloadLen:uint32 BE | payload. Conn 1 carries the plugin's
//   ttrpc service (runtime -> plugin calls), conn 2 the runtime's (plugin -> runtime calls);
//   conn 0 is reserved. A logical conn is a byte stream: one ttrpc message may span frames.
// - ttrpc (ttrpc@v1.2.8:channel.go, PROTOCOL.md): Length:uint32 BE | StreamID:uint32 BE |
//   Type:uint8 | Flags:uint8 | data[Length], data at most 4 MiB.
// Readers are incremental (bytes in, whole frames or messages out) so they are tested on partial
// reads, and refuse what upstream would never send: a peer that does is dropped (fail closed).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace gpufence::nri {

constexpr size_t kMuxHeaderLen = 8;
constexpr size_t kTtrpcHeaderLen = 10;
constexpr size_t kTtrpcMaxData = 4u << 20;  // messageLengthMax, ttrpc@v1.2.8:channel.go
// mux.go maxPayloadSize since v0.8.0: one ttrpc header plus its largest message. (v0.6.1 allowed
// 1<<24 but its ttrpc never sends a message above kTtrpcMaxData either.)
constexpr size_t kMuxMaxPayload = kTtrpcHeaderLen + kTtrpcMaxData;
// The Go peer reads each frame whole through ttrpc's 4096-byte bufio.Reader and fails with
// ENOMEM when the first frame of a message is larger (mux.go conn.Read): so is every first frame.
constexpr size_t kGoFirstReadLen = 4096;

enum class ConnId : uint32_t { plugin_service = 1, runtime_service = 2 };

struct MuxFrame {
  uint32_t conn = 0;
  std::string payload;
};

std::string encode_mux_frame(uint32_t conn, std::string_view payload);

// Reassembles mux frames from socket reads of any size.
class MuxReader {
 public:
  void feed(std::string_view bytes) { m_buffer.append(bytes); }
  // A whole frame, nullopt when more bytes are needed, an error for a frame upstream never sends
  // (conn 0, a payload over kMuxMaxPayload): the connection must then be closed.
  Result<std::optional<MuxFrame>> next();
  size_t buffered() const { return m_buffer.size() - m_offset; }

 private:
  std::string m_buffer;
  size_t m_offset = 0;
};

enum class TtrpcType : uint8_t { request = 1, response = 2, data = 3 };

struct TtrpcMessage {
  uint32_t stream = 0;
  uint8_t type = 0;
  uint8_t flags = 0;
  std::string data;
  // When the socket read that completed it returned (a decision's budget counts from there);
  // unset (epoch) in messages built here or in tests: "now".
  std::chrono::steady_clock::time_point received{};
};

std::string encode_ttrpc_header(uint32_t length, uint32_t stream, uint8_t type, uint8_t flags);

// The mux frames that carry one ttrpc message on `conn`: one frame when it fits the Go peer's
// first read, else the 10-byte header alone and then the data (both decoded by containerd,
// docs/nri.md). Refuses data over kTtrpcMaxData (ttrpc >= v1.2.7 refuses to send it too).
Result<std::vector<std::string>> encode_ttrpc_frames(uint32_t conn, const TtrpcMessage& message);

// Reassembles ttrpc messages from one logical conn's bytes, across frames of any size.
class TtrpcReader {
 public:
  void feed(std::string_view bytes) { m_buffer.append(bytes); }
  // A whole message, nullopt when more bytes are needed, an error for data over kTtrpcMaxData or
  // an unknown message type.
  Result<std::optional<TtrpcMessage>> next();

 private:
  std::string m_buffer;
  size_t m_offset = 0;
};

}  // namespace gpufence::nri
