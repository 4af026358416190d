// Baseline for the plugin's memory: a gRPC C++ server doing nothing, on a Unix socket, built
// against the same Debian gRPC. Runs until killed.
#include <grpcpp/grpcpp.h>

#include <thread>

#include "deviceplugin/api.hpp"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  v1beta1::DevicePlugin::Service service;  // every method answers UNIMPLEMENTED
  grpc::ServerBuilder builder;
  builder.AddListeningPort(std::string("unix://") + argv[1], grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server) return 1;
  server->Wait();
}
