// NRI's framings (src/nri/wire.hpp): round trips, reads split anywhere, what upstream never sends
// refused, and the bytes of the worked RegisterPlugin example from docs/nri.md.
#include <gtest/gtest.h>

#include <random>

#include "nri/service.hpp"
#include "nri/wire.hpp"

using namespace gpufence;
using namespace gpufence::nri;

namespace {

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

std::vector<MuxFrame> drain(MuxReader& r) {
  std::vector<MuxFrame> out;
  for (;;) {
    auto f = r.next();
    EXPECT_TRUE(f) << f.error().message;
    if (!f || !*f) return out;
    out.push_back(std::move(**f));
  }
}

}  // namespace

TEST(NriMux, FrameRoundTripsFedOneByteAtATime) {
  std::string wire = encode_mux_frame(1, "hello") + encode_mux_frame(2, "");
  EXPECT_EQ(hex(wire.substr(0, 8)), "0000000100000005");  // big-endian conn, length
  MuxReader r;
  std::vector<MuxFrame> got;
  for (char c : wire) {
    r.feed(std::string_view(&c, 1));
    for (auto& f : drain(r)) got.push_back(std::move(f));
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].conn, 1u);
  EXPECT_EQ(got[0].payload, "hello");
  EXPECT_EQ(got[1].conn, 2u);
  EXPECT_EQ(got[1].payload, "");
  EXPECT_EQ(r.buffered(), 0u);
}

TEST(NriMux, ReservedConnAndOversizeFramesAreRefusedFromTheHeaderAlone) {
  MuxReader zero;
  zero.feed(std::string("\0\0\0\0\0\0\0\1", 8));
  EXPECT_FALSE(zero.next());
  MuxReader big;
  std::string header = encode_mux_frame(1, "").substr(0, 4);
  uint32_t len = static_cast<uint32_t>(kMuxMaxPayload + 1);
  for (int s : {24, 16, 8, 0}) header.push_back(static_cast<char>((len >> s) & 0xff));
  big.feed(header);  // no payload needed to refuse it
  auto f = big.next();
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message.find("exceeds"), std::string::npos);
  // The largest legal frame is waited for, not refused.
  MuxReader max;
  std::string ok_header = encode_mux_frame(1, "").substr(0, 4);
  len = static_cast<uint32_t>(kMuxMaxPayload);
  for (int s : {24, 16, 8, 0}) ok_header.push_back(static_cast<char>((len >> s) & 0xff));
  max.feed(ok_header);
  auto m = max.next();
  ASSERT_TRUE(m);
  EXPECT_FALSE(*m);
}

TEST(NriTtrpc, SmallMessagesGoInOneFrameLargeOnesHeaderFirst) {
  TtrpcMessage small{1, 1, 0, std::string(4086, 'x')};  // 10 + 4086 = 4096: the Go peer's read
  auto f = encode_ttrpc_frames(2, small);
  ASSERT_TRUE(f);
  ASSERT_EQ(f->size(), 1u);
  EXPECT_EQ((*f)[0].size(), kMuxHeaderLen + 4096);

  TtrpcMessage large{3, 1, 0, std::string(4087, 'y')};
  f = encode_ttrpc_frames(2, large);
  ASSERT_TRUE(f);
  ASSERT_EQ(f->size(), 2u);
  EXPECT_EQ((*f)[0].size(), kMuxHeaderLen + kTtrpcHeaderLen);  // first frame: the header alone
  EXPECT_EQ((*f)[1].size(), kMuxHeaderLen + 4087);

  TtrpcMessage too_big{5, 1, 0, std::string(kTtrpcMaxData + 1, 'z')};
  EXPECT_FALSE(encode_ttrpc_frames(2, too_big));
}

TEST(NriTtrpc, MessagesReassembleAcrossAnySplit) {
  std::string wire;
  std::vector<TtrpcMessage> sent = {
      {1, 1, 0, "first"}, {3, 2, 0, std::string(70000, 'q')}, {5, 1, 0, ""}};
  for (const auto& m : sent) {
    auto frames = encode_ttrpc_frames(1, m).value();
    for (const auto& frame : frames) {
      MuxReader mux;
      mux.feed(frame);
      wire += drain(mux).at(0).payload;
    }
  }
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    TtrpcReader r;
    std::vector<TtrpcMessage> got;
    for (size_t at = 0; at < wire.size();) {
      size_t n = std::min<size_t>(wire.size() - at, 1 + rng() % 9000);
      r.feed(std::string_view(wire).substr(at, n));
      at += n;
      for (;;) {
        auto m = r.next();
        ASSERT_TRUE(m);
        if (!*m) break;
        got.push_back(std::move(**m));
      }
    }
    ASSERT_EQ(got.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(got[i].stream, sent[i].stream);
      EXPECT_EQ(got[i].type, sent[i].type);
      EXPECT_EQ(got[i].data, sent[i].data);
    }
  }
}

TEST(NriTtrpc, OversizeAndUnknownTypesFailClosed) {
  TtrpcReader big;
  big.feed(encode_ttrpc_header(static_cast<uint32_t>(kTtrpcMaxData + 1), 1, 1, 0));
  EXPECT_FALSE(big.next());
  TtrpcReader odd;
  odd.feed(encode_ttrpc_header(0, 1, 7, 0));
  EXPECT_FALSE(odd.next());
}

TEST(NriTtrpc, GarbageNeverCrashesAndNeverYieldsAnOversizeMessage) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    std::string junk(rng() % 64, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    MuxReader mux;
    TtrpcReader t;
    mux.feed(junk);
    t.feed(junk);
    for (int i = 0; i < 8; ++i) {
      auto f = mux.next();
      if (!f || !*f) break;
      EXPECT_LE((*f)->payload.size(), kMuxMaxPayload);
    }
    for (int i = 0; i < 8; ++i) {
      auto m = t.next();
      if (!m || !*m) break;
      EXPECT_LE((*m)->data.size(), kTtrpcMaxData);
    }
  }
}

// docs/nri.md's worked example: plugin "gpu-iso", index 10, RegisterPlugin on conn 2, stream 1.
TEST(NriTtrpc, RegisterPluginBytesMatchTheWorkedExample) {
  auto frames = encode_ttrpc_frames(2, register_request(1, "gpu-iso", "10")).value();
  ASSERT_EQ(frames.size(), 1u);
  std::string payload = "0a07" + hex("gpu-iso") + "1202" + hex("10") + "1a07" + hex("v0.12.0");
  std::string request = "0a1c" + hex("nri.pkg.api.v1alpha1.Runtime") + "120e" +
                        hex("RegisterPlugin") + "1a16" + payload;
  EXPECT_EQ(hex(frames[0]),
            "00000002"
            "00000050"
            "00000046"
            "00000001"
            "01"
            "00" +
                request);
}
