// A test kubelet: no kubelet can be installed here, so this stands in for one, speaking the same
// protos and behaving as the real one does (pkg/kubelet/cm/devicemanager):
// - on start it deletes every socket in the plugin directory, then serves Registration on
//   kubelet.sock;
// - on Register it dials the plugin back at <dir>/<endpoint>, asks its options and consumes
//   ListAndWatch, keeping each device's health;
// - it admits a container with GetPreferredAllocation, then Allocate;
// - it can be stopped and started again (a kubelet restart), or drop the stream alone;
// - with emulate_upstream_run_client(), a registration's client lives as the real kubelet's does
//   (see there), so a plugin that registers twice meets what it meets on a real node.
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

  // From the next start() on, clients live as in the real kubelet's device manager
  // (pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go, the releases that keep one client
  // per resource name): a Register stores a new client as the current one for its resource and
  // does not end the client it replaces; when any client's ListAndWatch stream ends, runClient
  // disconnects the client *current* for that name, which may be a newer registration's
  // (closing its connection, so its stream ends too), and PluginDisconnected marks every device
  // of the resource Unhealthy until a stream sends the list again. `reaction` is how long after
  // a stream's end that happens (the goroutine's scheduling on a busy node). stop() disconnects
  // every client first, then stops serving, as the kubelet's Stop does.
  void emulate_upstream_run_client(std::chrono::milliseconds reaction = {});
  // Sends `req` to this kubelet's Registration service as a plugin would (a second Register).
  grpc::Status register_plugin(const v1beta1::RegisterRequest& req);
  // Upstream mode: ends the ListAndWatch stream of the `n`-th registration (1-based) from the
  // kubelet's side, as a broken connection would; false when there is no such client.
  bool end_stream_of(int n);
  // Upstream mode: streams that ended so far, and disconnects runClient (or Stop) made.
  int streams_ended() const;
  int disconnects() const;
  bool wait_disconnects(int count, std::chrono::milliseconds timeout) const;
  // Whether `n` devices are allocatable: all listed Healthy and, in upstream mode, a client
  // connected for them (a disconnected resource has no endpoint to Allocate through).
  bool wait_allocatable(size_t n, std::chrono::milliseconds timeout) const;

  int registrations() const;
  v1beta1::RegisterRequest last_registration() const;
  bool wait_registrations(int count, std::chrono::milliseconds timeout) const;

  using Devices = std::map<std::string, std::string>;  // id -> "Healthy"/"Unhealthy"
  Devices devices() const;
  // The devices the kubelet counts as allocatable (Healthy).
  static size_t healthy(const Devices& d);
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
  struct Client;
  grpc::Status on_register(const v1beta1::RegisterRequest& req);
  grpc::Status on_register_upstream(const v1beta1::RegisterRequest& req);
  void run_client(const std::shared_ptr<Client>& c);
  void disconnect(Client& c);  // under m_mu
  void stop_upstream();
  void set_devices(const v1beta1::ListAndWatchResponse& resp);  // under m_mu
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

  // Upstream mode (emulate_upstream_run_client), under m_mu.
  bool m_upstream = false;
  std::chrono::milliseconds m_reaction{0};
  long m_instance = 0;        // bumped by start(): a client of an older one is a dead process's
  bool m_stopping = false;    // stop() began: the instance accepts and reacts to nothing more
  std::map<std::string, std::shared_ptr<Client>> m_clients;  // the current client per resource
  std::vector<std::shared_ptr<Client>> m_all_clients;        // to end and join them on stop()
  int m_streams_ended = 0;
  int m_disconnects = 0;
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
