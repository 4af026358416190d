// libFuzzer target: bytes a peer on containerd's NRI socket sends gpufence-nri (src/nri/wire.hpp).
// Input: byte 0 picks the read size (1..256), the rest is the socket's stream.
// Beyond "no crash": no frame or message above upstream's maxima is ever yielded; once a reader
// fails it is not read again (the session ends, fail closed); every message decoded re-encodes
// into frames that decode to the same message, each first frame within the Go peer's 4096-byte
// read.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "nri/wire.hpp"

using namespace gpufence::nri;

namespace {

void check_round_trip(const TtrpcMessage& m) {
  auto frames = encode_ttrpc_frames(1, m);
  if (!frames) std::abort();  // a decoded message is within the limit, so it must re-encode
  if ((*frames)[0].size() > kMuxHeaderLen + kGoFirstReadLen) std::abort();
  MuxReader mux;
  TtrpcReader reader;
  for (const auto& f : *frames) mux.feed(f);
  for (;;) {
    auto f = mux.next();
    if (!f) std::abort();
    if (!*f) break;
    reader.feed((*f)->payload);
  }
  auto back = reader.next();
  if (!back || !*back) std::abort();
  if ((*back)->stream != m.stream || (*back)->type != m.type || (*back)->flags != m.flags ||
      (*back)->data != m.data)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t chunk = 1 + data[0];
  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  MuxReader mux;
  std::map<uint32_t, TtrpcReader> conns;
  for (size_t at = 0; at < stream.size(); at += chunk) {
    mux.feed(stream.substr(at, chunk));
    for (;;) {
      auto frame = mux.next();
      if (!frame) return 0;  // the session would end here
      if (!*frame) break;
      if ((*frame)->conn == 0 || (*frame)->payload.size() > kMuxMaxPayload) std::abort();
      TtrpcReader& reader = conns[(*frame)->conn];
      reader.feed((*frame)->payload);
      for (;;) {
        auto message = reader.next();
        if (!message) return 0;
        if (!*message) break;
        if ((*message)->data.size() > kTtrpcMaxData) std::abort();
        if ((*message)->type < 1 || (*message)->type > 3) std::abort();
        check_round_trip(**message);
      }
    }
  }
  return 0;
}
