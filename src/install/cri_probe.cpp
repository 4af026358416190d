// The real RuntimeProbe: one CRI Status call over the containerd socket, through gRPC's generic
// stub and the messages of proto/cri/v1/api.proto (the v1 and v1alpha2 wire forms are the same).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "cri/v1/api.pb.h"
#include "install/runner.hpp"

namespace gpufence {
namespace {

Result<grpc::ByteBuffer> serialize(const google::protobuf::MessageLite& msg) {
  std::string bytes;
  if (!msg.SerializeToString(&bytes)) return fail(Errc::internal, "serialize CRI StatusRequest");
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

class CriProbe final : public RuntimeProbe {
 public:
  Result<std::vector<LoadedRuntime>> loaded_runtimes(const std::string& socket,
                                                     std::chrono::milliseconds timeout) override {
    auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    Error last{Errc::rpc, ""};
    for (const char* method :
         {"/runtime.v1.RuntimeService/Status", "/runtime.v1alpha2.RuntimeService/Status"}) {
      auto info = status_info(channel, method, timeout);
      if (!info) {
        last = info.error();
        if (info.error().code == Errc::unsupported) continue;  // try the older API
        return std::unexpected(info.error());
      }
      auto config = info->find("config");
      if (config == info->end())
        return fail(Errc::parse, "CRI status from ", socket, " carries no info[\"config\"]");
      auto runtimes = parse_cri_config_runtimes(config->second);
      if (!runtimes) return std::unexpected(runtimes.error().wrap(socket));
      return runtimes;
    }
    return std::unexpected(last);
  }

  Result<std::string> runtime_version(const std::string& socket,
                                      std::chrono::milliseconds timeout) override {
    auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    Error last{Errc::rpc, ""};
    for (const char* method :
         {"/runtime.v1.RuntimeService/Version", "/runtime.v1alpha2.RuntimeService/Version"}) {
      runtime::v1::VersionRequest req;
      auto bytes = call(channel, method, req, timeout);
      if (!bytes) {
        last = bytes.error();
        if (bytes.error().code == Errc::unsupported) continue;
        return std::unexpected(bytes.error());
      }
      runtime::v1::VersionResponse resp;
      if (!resp.ParseFromString(*bytes))
        return fail(Errc::parse, "CRI ", method, ": answer is not a VersionResponse");
      return resp.runtime_version();
    }
    return std::unexpected(last);
  }

 private:
  // One unary call through the generic stub: the answer's bytes.
  static Result<std::string> call(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& method,
                                  const google::protobuf::MessageLite& req,
                                  std::chrono::milliseconds timeout) {
    auto request = serialize(req);
    if (!request) return std::unexpected(request.error());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    grpc::CompletionQueue cq;
    auto c = stub.PrepareUnaryCall(&ctx, method, *request, &cq);
    c->StartCall();
    grpc::ByteBuffer response;
    grpc::Status status;
    c->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED)
      return fail(Errc::unsupported, method, ": ", status.error_message());
    if (!status.ok())
      return fail(Errc::rpc, "CRI ", method, ": ", status.error_message(), " (code ",
                  static_cast<int>(status.error_code()), ")");
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return fail(Errc::rpc, "CRI ", method, ": unreadable answer");
    std::string bytes;
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes;
  }

  static Result<std::map<std::string, std::string>> status_info(
      const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
      std::chrono::milliseconds timeout) {
    runtime::v1::StatusRequest req;
    req.set_verbose(true);
    auto bytes = call(channel, method, req, timeout);
    if (!bytes) return std::unexpected(bytes.error());
    runtime::v1::StatusResponse resp;
    if (!resp.ParseFromString(*bytes))
      return fail(Errc::parse, "CRI ", method, ": answer is not a StatusResponse");
    return std::map<std::string, std::string>(resp.info().begin(), resp.info().end());
  }
};

}  // namespace

std::unique_ptr<RuntimeProbe> make_cri_probe() {
  return std::make_unique<CriProbe>();
}

}  // namespace gpufence
