// A test kubelet: no kubelet can be installed here, so this stands in for one, speaking the same
// protos and behaving as the real one does (pkg/kubelet/cm/devicemanager):
// - on start it deletes every socket in the plugin directory, then serves Registration on
//   kubelet.sock;
// - on Register it dials the plugin back at <dir>/<endpoint>, asks its options and consumes
//   ListAndWatch, keeping each device's health;
// - it admits a container with GetPreferredAllocation, then Allocate;
// - it can be stopped and started again (a kubelet restart), or drop the stream alone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "deviceplugin/api.hpp"

namespace gpufence::test {

class TestKubelet {
 public:
  explicit TestKubelet(std::filesystem::path plugin_dir);
  ~TestKubelet();

  void start();
  void stop();
  // Ends the ListAndWatch stream but keeps serving Registration: a kubelet that lost the plugin
  // without restarting (the plugin should register again).
  void drop_stream();

  int registrations() const;
  v1beta1::RegisterRequest last_registration() const;
  bool wait_registrations(int count, std::chrono::milliseconds timeout) const;

  using Devices = std::map<std::string, std::string>;  // id -> "Healthy"/"Unhealthy"
  Devices devices() const;
  std::map<std::string, std::vector<long>> numa_nodes() const;
  bool wait_devices(const std::function<bool(const Devices&)>& pred,
                    std::chrono::milliseconds timeout) const;

  grpc::Status preferred(const std::vector<std::string>& available,
                         const std::vector<std::string>& must_include, int size,
                         std::vector<std::string>* out);
  grpc::Status allocate(const std::vector<std::vector<std::string>>& containers,
                        v1beta1::AllocateResponse* out);
  // What the kubelet does to admit one container asking for `count` devices (devicemanager
  // manager.go devicesToAllocate): first the `reusable` devices (an init container's, for the
  // containers after it), then GetPreferredAllocation's ids that are still free, then any free
  // healthy device; then Allocate with the chosen ids.
  grpc::Status admit(int count, v1beta1::ContainerAllocateResponse* out,
                     std::vector<std::string>* ids = nullptr,
                     const std::vector<std::string>& reusable = {});
  void release_all() { m_assigned.clear(); }
  // Devices the checkpoint says are held (the kubelet's allocatedDevices after a restart).
  void assign(const std::vector<std::string>& ids);
  int allocate_calls() const { return m_allocate_calls; }
  // The pod that held `ids` is gone: the kubelet's device manager frees them for the next one.
  void release(const std::vector<std::string>& ids);

 private:
  class RegistrationService;
  void on_register(const v1beta1::RegisterRequest& req);
  std::unique_ptr<v1beta1::DevicePlugin::Stub> plugin_stub();

  std::filesystem::path m_dir;
  mutable std::mutex m_mu;
  mutable std::condition_variable m_cv;
  int m_registrations = 0;
  v1beta1::RegisterRequest m_last;
  Devices m_devices;
  std::map<std::string, std::vector<long>> m_numa;
  std::vector<std::string> m_assigned;
  int m_allocate_calls = 0;

  std::unique_ptr<RegistrationService> m_service;
  std::unique_ptr<grpc::Server> m_server;
  std::shared_ptr<grpc::Channel> m_plugin_channel;
  std::mutex m_stream_mu;  // guards the stream below: Register handlers and stop() both touch it
  std::unique_ptr<grpc::ClientContext> m_stream_ctx;
  std::thread m_stream_thread;
};

// devicesToAllocate's choice of `count` ids, given the devices a container may reuse, the free
// healthy ones (`available`, in the kubelet's order) and the plugin's preferred ids: reusable
// first, then preferred ids that are free (preferred.Intersection(available)), then the rest of
// `available` when the plugin named too few or named devices that are not free. Empty when
// `available` and `reusable` together hold fewer than `count`.
std::vector<std::string> choose_devices(const std::vector<std::string>& reusable,
                                        const std::vector<std::string>& available,
                                        const std::vector<std::string>& preferred, int count);

// A child process (the real plugin binary) that tests can signal and wait for.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             const std::string& log_path);
  ~Subprocess();
  pid_t pid() const { return m_pid; }
  bool running();
  // Sends `sig`, waits up to `timeout`; returns the exit status, or -1 if it did not exit.
  int signal_and_wait(int sig, std::chrono::milliseconds timeout);

 private:
  pid_t m_pid = -1;
  int m_status = -1;
  bool m_reaped = false;
};

}  // namespace gpufence::test
