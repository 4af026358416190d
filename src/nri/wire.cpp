#include "nri/wire.hpp"

namespace gpufence::nri {
namespace {

void put_u32(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>((v >> 24) & 0xff));
  out.push_back(static_cast<char>((v >> 16) & 0xff));
  out.push_back(static_cast<char>((v >> 8) & 0xff));
  out.push_back(static_cast<char>(v & 0xff));
}

uint32_t get_u32(std::string_view in) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(in[i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

// Drops consumed bytes once they dominate the buffer, so a long session does not grow it.
void compact(std::string& buffer, size_t& offset) {
  if (offset > 0 && offset * 2 >= buffer.size()) {
    buffer.erase(0, offset);
    offset = 0;
  }
  // A 4 MiB request leaves no 4 MiB buffer behind once it is consumed.
  if (buffer.empty() && buffer.capacity() > (1u << 20)) std::string().swap(buffer);
}

}  // namespace

std::string encode_mux_frame(uint32_t conn, std::string_view payload) {
  std::string out;
  out.reserve(kMuxHeaderLen + payload.size());
  put_u32(out, conn);
  put_u32(out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}

Result<std::optional<MuxFrame>> MuxReader::next() {
  std::string_view rest = std::string_view(m_buffer).substr(m_offset);
  if (rest.size() < kMuxHeaderLen) return std::nullopt;
  uint32_t conn = get_u32(rest);
  uint32_t len = get_u32(rest.substr(4));
  if (conn == 0) return fail(Errc::parse, "NRI mux frame on reserved conn 0");
  if (len > kMuxMaxPayload)
    return fail(Errc::parse, "NRI mux frame of ", len, " bytes exceeds ", kMuxMaxPayload);
  if (rest.size() < kMuxHeaderLen + len) return std::nullopt;
  MuxFrame frame{conn, std::string(rest.substr(kMuxHeaderLen, len))};
  m_offset += kMuxHeaderLen + len;
  compact(m_buffer, m_offset);
  return frame;
}

std::string encode_ttrpc_header(uint32_t length, uint32_t stream, uint8_t type, uint8_t flags) {
  std::string out;
  out.reserve(kTtrpcHeaderLen);
  put_u32(out, length);
  put_u32(out, stream);
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  return out;
}

Result<std::vector<std::string>> encode_ttrpc_frames(uint32_t conn, const TtrpcMessage& message) {
  if (message.data.size() > kTtrpcMaxData)
    return fail(Errc::invalid_argument, "ttrpc message of ", message.data.size(), " bytes exceeds ",
                kTtrpcMaxData);
  std::string header = encode_ttrpc_header(static_cast<uint32_t>(message.data.size()),
                                           message.stream, message.type, message.flags);
  std::vector<std::string> frames;
  if (kTtrpcHeaderLen + message.data.size() <= kGoFirstReadLen) {
    frames.push_back(encode_mux_frame(conn, header + message.data));
  } else {
    frames.push_back(encode_mux_frame(conn, header));
    frames.push_back(encode_mux_frame(conn, message.data));
  }
  return frames;
}

Result<std::optional<TtrpcMessage>> TtrpcReader::next() {
  std::string_view rest = std::string_view(m_buffer).substr(m_offset);
  if (rest.size() < kTtrpcHeaderLen) return std::nullopt;
  uint32_t len = get_u32(rest);
  if (len > kTtrpcMaxData)
    return fail(Errc::parse, "ttrpc message of ", len, " bytes exceeds ", kTtrpcMaxData);
  uint8_t type = static_cast<uint8_t>(rest[8]);
  if (type < 1 || type > 3) return fail(Errc::parse, "ttrpc message of unknown type ", +type);
  if (rest.size() < kTtrpcHeaderLen + len) return std::nullopt;
  TtrpcMessage message{get_u32(rest.substr(4)), type, static_cast<uint8_t>(rest[9]),
                       std::string(rest.substr(kTtrpcHeaderLen, len))};
  m_offset += kTtrpcHeaderLen + len;
  compact(m_buffer, m_offset);
  return message;
}

}  // namespace gpufence::nri
