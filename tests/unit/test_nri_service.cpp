// The plugin's answers (src/nri/service.hpp) and one whole session over a socketpair against a
// scripted runtime that calls Configure before it answers RegisterPlugin, as containerd does.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "common/escape.hpp"
#include "nri/fence.hpp"
#include "nri/session.hpp"
#include "nri/status.hpp"
#include "ttrpc/request.pb.h"

using namespace gpufence;
using namespace gpufence::nri;

namespace {

class FakeHandler : public PluginHandler {
 public:
  Status configured(const RuntimeInfo& r) override {
    if (r.config == "broken") return fail(Errc::parse, "broken config");
    runtime = r;
    return {};
  }
  void synchronized(const api::SynchronizeRequest& r) override { synced += r.containers_size(); }
  Result<api::ContainerAdjustment> create_container(const api::PodSandbox&, const api::Container& c,
                                                    SteadyTime) override {
    if (c.name() == "refuse") return fail(Errc::denied, "not this one");
    if (c.name() == "huge-refusal") return fail(Errc::denied, std::string(8u << 20, 'x'));
    if (c.name() == "huge-answer") {
      api::ContainerAdjustment a;
      auto* kv = a.add_env();
      kv->set_key("BIG");
      kv->set_value(std::string(5u << 20, 'y'));
      return a;
    }
    if (c.name() == "throws") throw std::runtime_error("broken invariant");
    api::ContainerAdjustment a;
    auto* kv = a.add_env();
    kv->set_key("CUDA_VISIBLE_DEVICES");
    kv->set_value(c.id());
    return a;
  }
  RuntimeInfo runtime;
  int synced = 0;
};

TtrpcMessage call(uint32_t stream, std::string_view service, std::string_view method,
                  const google::protobuf::MessageLite& payload) {
  ::ttrpc::Request r;
  r.set_service(std::string(service));
  r.set_method(std::string(method));
  r.set_payload(payload.SerializeAsString());
  r.set_timeout_nano(2'000'000'000);
  TtrpcMessage m{stream, 1, 0, {}};
  r.SerializeToString(&m.data);
  return m;
}

::ttrpc::Response response_of(const TtrpcMessage& m) {
  EXPECT_EQ(m.type, 2);
  ::ttrpc::Response r;
  EXPECT_TRUE(r.ParseFromString(m.data));
  return r;
}

}  // namespace

TEST(NriVersion, AnnouncedOrInferredFromContainerdsVersion) {
  api::ConfigureRequest c;
  c.set_runtime_name("containerd");
  c.set_runtime_version("v2.3.4");
  c.set_nri_version("v0.12.0");
  EXPECT_TRUE(runtime_info(c).device_rules);
  c.set_nri_version("");  // v0.8 and older runtimes do not announce one
  c.set_runtime_version("v2.1.9");
  EXPECT_EQ(runtime_info(c).nri_text(), "v0.8.0");
  EXPECT_FALSE(runtime_info(c).device_rules);
  c.set_runtime_version("1.7.24");
  EXPECT_EQ(runtime_info(c).nri_text(), "v0.6.1");
  c.set_runtime_version("v2.2.0");
  EXPECT_TRUE(runtime_info(c).device_rules);
  c.set_runtime_version("v1.7.26");
  EXPECT_EQ(runtime_info(c).nri_text(), "v0.8.0");
  c.set_runtime_name("cri-o");
  c.set_runtime_version("1.30.0");
  EXPECT_FALSE(runtime_info(c).nri);  // unknown: no device rules assumed
  EXPECT_FALSE(runtime_info(c).device_rules);
  EXPECT_FALSE(parse_nri_version("(devel)"));
  EXPECT_FALSE(parse_nri_version("0.0.0-unknown"));
}

TEST(NriService, ConfigureSubscribesToCreateContainerOnly) {
  FakeHandler h;
  api::ConfigureRequest c;
  c.set_runtime_name("containerd");
  c.set_runtime_version("v2.1.9");
  auto r = response_of(answer_request(call(1, kPluginService, "Configure", c), h));
  EXPECT_FALSE(r.has_status());  // success: no status, as ttrpc's Go server sends it
  api::ConfigureResponse out;
  ASSERT_TRUE(out.ParseFromString(r.payload()));
  EXPECT_EQ(out.events(), 0x8);  // CREATE_CONTAINER; valid on 0x7FF runtimes (1.7, 2.1)
  EXPECT_EQ(h.runtime.version, "v2.1.9");
  // A config the plugin cannot use fails Configure, so the runtime drops the plugin.
  c.set_config("broken");
  EXPECT_EQ(response_of(answer_request(call(3, kPluginService, "Configure", c), h)).status().code(),
            9);
}

TEST(NriService, SplitSynchronizeIsAnsweredMoreWithoutUpdates) {
  FakeHandler h;
  api::SynchronizeRequest s;
  s.add_containers()->set_id("a");
  s.set_more(true);
  api::SynchronizeResponse out;
  ASSERT_TRUE(out.ParseFromString(
      response_of(answer_request(call(3, kPluginService, "Synchronize", s), h)).payload()));
  EXPECT_TRUE(out.more());
  EXPECT_EQ(out.update_size(), 0);
  s.set_more(false);
  ASSERT_TRUE(out.ParseFromString(
      response_of(answer_request(call(5, kPluginService, "Synchronize", s), h)).payload()));
  EXPECT_FALSE(out.more());
  EXPECT_EQ(h.synced, 2);
}

TEST(NriService, CreateContainerAdjustsOrFailsTheCreate) {
  FakeHandler h;
  api::CreateContainerRequest c;
  c.mutable_container()->set_id("ctr1");
  auto m = answer_request(call(7, kPluginService, "CreateContainer", c), h);
  EXPECT_EQ(m.stream, 7u);
  api::CreateContainerResponse out;
  ASSERT_TRUE(out.ParseFromString(response_of(m).payload()));
  ASSERT_EQ(out.adjust().env_size(), 1);
  EXPECT_EQ(out.adjust().env(0).value(), "ctr1");

  c.mutable_container()->set_name("refuse");
  auto r = response_of(answer_request(call(9, kPluginService, "CreateContainer", c), h));
  EXPECT_EQ(r.status().code(), 9);
  EXPECT_EQ(r.status().message(), "not this one");
}

TEST(NriService, UnknownMethodsAndGarbageAreAnsweredNotCrashed) {
  FakeHandler h;
  api::Empty e;
  EXPECT_EQ(
      response_of(answer_request(call(1, kPluginService, "Frobnicate", e), h)).status().code(), 12);
  EXPECT_EQ(response_of(answer_request(call(1, "x.Other", "Configure", e), h)).status().code(), 12);
  // Lifecycle events a v0.12 runtime may call are answered OK (Unimplemented would switch it to
  // StateChange for this plugin).
  for (const char* method : {"StateChange", "StartContainer", "RemoveContainer", "Shutdown"}) {
    auto r = response_of(answer_request(call(1, kPluginService, method, e), h));
    EXPECT_FALSE(r.has_status()) << method;
  }
  EXPECT_EQ(response_of(answer_request(TtrpcMessage{1, 1, 0, "\xff\xff\xff"}, h)).status().code(),
            3);
  api::CreateContainerRequest bad;
  TtrpcMessage m = call(1, kPluginService, "CreateContainer", bad);
  ::ttrpc::Request r;
  r.ParseFromString(m.data);
  r.set_payload("\x12\xff\x01");  // container: a length running past the end
  r.SerializeToString(&m.data);
  EXPECT_EQ(response_of(answer_request(m, h)).status().code(), 3);
}

TEST(NriSession, ConfigureBeforeTheRegisterReplyThenCreateThenClose) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  FakeHandler h;
  Logger log(LogLevel::off);
  Status result;
  std::thread plugin([&] { result = run_session(sv[0], SessionOptions{}, h, log); });

  // The runtime's side, scripted: read until one whole ttrpc message on `conn` arrives.
  MuxReader mux;
  TtrpcReader conns[3];
  auto receive = [&](uint32_t conn) -> TtrpcMessage {
    char buf[8192];
    for (;;) {
      if (auto m = conns[conn].next(); m && *m) return **m;
      ssize_t n = ::read(sv[1], buf, sizeof buf);
      if (n <= 0) return {};
      mux.feed(std::string_view(buf, static_cast<size_t>(n)));
      while (auto f = mux.next()) {
        if (!*f) break;
        conns[(*f)->conn].feed((*f)->payload);
      }
    }
  };
  auto send = [&](uint32_t conn, const TtrpcMessage& m) {
    auto frames = encode_ttrpc_frames(conn, m).value();
    for (const auto& f : frames)
      ASSERT_EQ(::write(sv[1], f.data(), f.size()), static_cast<ssize_t>(f.size()));
  };

  TtrpcMessage reg = receive(2);
  ::ttrpc::Request req;
  ASSERT_TRUE(req.ParseFromString(reg.data));
  EXPECT_EQ(req.method(), "RegisterPlugin");
  EXPECT_EQ(reg.stream, 1u);
  api::RegisterPluginRequest rp;
  ASSERT_TRUE(rp.ParseFromString(req.payload()));
  EXPECT_EQ(rp.plugin_name(), "gpufence-nri");
  EXPECT_EQ(rp.plugin_idx(), "10");

  api::ConfigureRequest c;
  c.set_runtime_name("containerd");
  c.set_nri_version("v0.12.0");
  send(1, call(1, kPluginService, "Configure", c));  // before the RegisterPlugin answer
  EXPECT_FALSE(response_of(receive(1)).has_status());
  send(2, TtrpcMessage{1, 2, 0, ::ttrpc::Response().SerializeAsString()});
  api::CreateContainerRequest cc;
  cc.mutable_container()->set_id(std::string(6000, 'i'));  // a multi-frame request
  send(1, call(3, kPluginService, "CreateContainer", cc));
  TtrpcMessage created = receive(1);
  EXPECT_EQ(created.stream, 3u);
  api::CreateContainerResponse out;
  ASSERT_TRUE(out.ParseFromString(response_of(created).payload()));
  EXPECT_EQ(out.adjust().env(0).value(), std::string(6000, 'i'));
  // Security round 4: answers that once ended the session (a refusal quoting megabytes, an
  // adjustment past ttrpc's 4 MiB, a handler that throws) each fail their one request; the
  // session answers the next one.
  uint32_t stream = 5;
  for (const char* name : {"huge-refusal", "huge-answer", "throws"}) {
    api::CreateContainerRequest bad;
    bad.mutable_container()->set_name(name);
    send(1, call(stream, kPluginService, "CreateContainer", bad));
    TtrpcMessage refused = receive(1);
    EXPECT_EQ(refused.stream, stream) << name;
    EXPECT_NE(response_of(refused).status().code(), 0) << name;
    stream += 2;
  }
  send(1, call(stream, kPluginService, "CreateContainer", cc));
  TtrpcMessage next = receive(1);
  EXPECT_EQ(next.stream, stream);
  EXPECT_FALSE(response_of(next).has_status());
  ::close(sv[1]);
  plugin.join();
  EXPECT_TRUE(result) << result.error().message;
  EXPECT_TRUE(h.runtime.device_rules);
  ::close(sv[0]);
}

TEST(NriSession, ARefusedRegistrationAndGarbageEndTheSessionWithAnError) {
  for (int variant = 0; variant < 2; ++variant) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    FakeHandler h;
    Logger log(LogLevel::off);
    Status result;
    std::thread plugin([&] { result = run_session(sv[0], SessionOptions{}, h, log); });
    if (variant == 0) {
      ::ttrpc::Response refused;
      refused.mutable_status()->set_code(3);
      refused.mutable_status()->set_message("invalid plugin name");
      auto frames =
          encode_ttrpc_frames(2, TtrpcMessage{1, 2, 0, refused.SerializeAsString()}).value();
      for (const auto& f : frames) ASSERT_GT(::write(sv[1], f.data(), f.size()), 0);
    } else {
      std::string junk("\0\0\0\0garbage!", 12);  // conn 0: refused
      ASSERT_GT(::write(sv[1], junk.data(), junk.size()), 0);
    }
    plugin.join();
    EXPECT_FALSE(result) << variant;
    ::close(sv[0]);
    ::close(sv[1]);
  }
}

// Security round 4: no pod input ends the session. A refusal quoting megabytes, an answer past
// ttrpc's 4 MiB and a handler that throws each fail their one request with a short answer.
TEST(NriService, EveryAnswerIsBoundedAndSendable) {
  FakeHandler h;
  api::CreateContainerRequest req;
  for (const char* name : {"huge-refusal", "huge-answer", "throws"}) {
    req.mutable_container()->set_name(name);
    auto reply = answer_request(call(7, kPluginService, "CreateContainer", req), h);
    EXPECT_EQ(reply.stream, 7u);
    EXPECT_LT(reply.data.size(), kMaxStatusMessageBytes + 256) << name;
    auto r = response_of(reply);
    EXPECT_NE(r.status().code(), 0) << name;
    EXPECT_LT(r.status().message().size(), kMaxStatusMessageBytes + 64) << name;
    auto frames = encode_ttrpc_frames(1, reply);
    EXPECT_TRUE(frames) << name;
  }
  // The cut names the length it cut.
  req.mutable_container()->set_name("huge-refusal");
  auto r = response_of(answer_request(call(9, kPluginService, "CreateContainer", req), h));
  EXPECT_NE(r.status().message().find("(8388608 bytes)"), std::string::npos);
}

TEST(NriService, PodBytesInARefusalAreEscapedOnce) {
  // The handler's message quotes pod bytes escaped (escape_excerpt); the answer does not escape
  // them a second time (a backslash is not doubled), but a raw control still cannot pass.
  class Quoting : public FakeHandler {
    Result<api::ContainerAdjustment> create_container(const api::PodSandbox&,
                                                      const api::Container& c,
                                                      SteadyTime) override {
      return fail(Errc::denied, "mount ", escape_excerpt(c.name()), " refused\x1b[2J");
    }
  } h;
  api::CreateContainerRequest req;
  req.mutable_container()->set_name("a\\b\x01");
  auto r = response_of(answer_request(call(3, kPluginService, "CreateContainer", req), h));
  EXPECT_EQ(r.status().message(), "mount a\\\\b\\x01 refused\\x1b[2J");
}

TEST(NriFence, LetsThroughOnlyWhatTheDeciderMarked) {
  api::ValidateContainerAdjustmentRequest req;
  req.mutable_container()->set_id("c-123");
  req.mutable_container()->set_name("app");
  const std::string key(kDecidedAnnotation);
  // Nothing from the decider: it timed out, crashed, or was never there.
  auto why = fence_rejection(req, "gpufence-nri");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("did not decide"), std::string::npos) << *why;
  // A mark that is not this container's id (a pod cannot know the id containerd generates).
  (*req.mutable_adjust()->mutable_annotations())[key] = "true";
  EXPECT_TRUE(fence_rejection(req, "gpufence-nri"));
  (*req.mutable_adjust()->mutable_annotations())[key] = "c-123";
  // The right value, but no owner recorded, or another plugin's stamp.
  EXPECT_TRUE(fence_rejection(req, "gpufence-nri"));
  auto& owners =
      (*(*req.mutable_owners()->mutable_owners())["c-123"].mutable_compound())[kFieldAnnotations];
  (*owners.mutable_owners())[key] = "05-other-plugin";
  why = fence_rejection(req, "gpufence-nri");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("05-other-plugin"), std::string::npos) << *why;
  (*owners.mutable_owners())[key] = "10-gpufence-nri-evil";
  EXPECT_TRUE(fence_rejection(req, "gpufence-nri"));
  (*owners.mutable_owners())[key] = "10-gpufence-nri";
  EXPECT_FALSE(fence_rejection(req, "gpufence-nri"));
}

TEST(NriFence, SubscribesToValidationOnlyAndRefusesARuntimeWithout) {
  Logger log(LogLevel::error);
  FenceHandler fence(log, "gpufence-nri");
  EXPECT_EQ(fence.events(), 1u << 13);  // VALIDATE_CONTAINER_ADJUSTMENT = 14
  api::ConfigureRequest c;
  c.set_runtime_name("containerd");
  c.set_runtime_version("v2.1.9");
  auto reply = answer_request(call(1, kPluginService, "Configure", c), fence);
  EXPECT_NE(response_of(reply).status().code(), 0);  // the runtime drops it, saying why
  c.set_runtime_version("v2.3.7");
  c.set_nri_version("v0.12.0");
  reply = answer_request(call(1, kPluginService, "Configure", c), fence);
  api::ConfigureResponse out;
  ASSERT_TRUE(out.ParseFromString(response_of(reply).payload()));
  EXPECT_EQ(out.events(), static_cast<int32_t>(1u << 13));
  // Through the service: a rejection with a bounded reason naming the pod.
  api::ValidateContainerAdjustmentRequest v;
  v.mutable_pod()->set_namespace_("tenant");
  std::string c1;
  for (int i = 0; i < 50'000; ++i) c1 += "\xc2\x80";  // U+0080: valid UTF-8, a C1 control
  v.mutable_pod()->set_name(c1);
  v.mutable_container()->set_id("c1");
  v.mutable_container()->set_name("app");
  reply = answer_request(call(5, kPluginService, "ValidateContainerAdjustment", v), fence);
  api::ValidateContainerAdjustmentResponse vr;
  ASSERT_TRUE(vr.ParseFromString(response_of(reply).payload()));
  EXPECT_TRUE(vr.reject());
  EXPECT_LT(vr.reason().size(), kMaxStatusMessageBytes + 64);
  EXPECT_NE(vr.reason().find("tenant/"), std::string::npos) << vr.reason();
}
