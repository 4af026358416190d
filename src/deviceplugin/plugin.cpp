#include "deviceplugin/plugin.hpp"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "deviceplugin/allocate.hpp"
#include "deviceplugin/api.hpp"
#include "deviceplugin/health.hpp"
#include "deviceplugin/preferred.hpp"

namespace gpufence {

namespace {

constexpr const char* kKubeletSocket = "kubelet.sock";
constexpr const char* kApiVersion = "v1beta1";
const std::vector<std::string> kControlNodes = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                                "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"};

// How well two GPUs are connected, for GetPreferredAllocation (higher is better).
int link_score(const Topology& t, bool same_numa) {
  switch (t.link) {
    case Link::nvlink:
      return 1000 + 10 * static_cast<int>(t.nvlinks);
    case Link::internal:
      return 900;
    case Link::single_switch:
      return 800;
    case Link::multiple_switch:
      return 700;
    case Link::host_bridge:
      return 600;
    default:
      return same_numa ? 400 : 0;
  }
}

}  // namespace

struct DevicePlugin::State {
  PluginContext ctx;
  HostFs host;
  std::vector<PluginDevice> devices;
  std::map<std::pair<std::string, std::string>, int> scores;  // by device id pair

  mutable std::mutex mu;
  std::condition_variable cv;
  HealthTracker health;
  std::uint64_t version = 1;     // bumped on every health change
  std::uint64_t generation = 0;  // bumped when the gRPC server is stopped
  bool stopping = false;
  std::atomic<bool> registered{false};

  State(PluginContext c, HostFs h, std::vector<PluginDevice> d, HealthTracker t)
      : ctx(std::move(c)), host(std::move(h)), devices(std::move(d)), health(std::move(t)) {}

  v1beta1::ListAndWatchResponse snapshot() const {  // call with mu held
    v1beta1::ListAndWatchResponse resp;
    for (const auto& d : devices) {
      auto* dev = resp.add_devices();
      dev->set_id(d.id);
      dev->set_health(health.healthy(d.gpu.uuid) ? "Healthy" : "Unhealthy");
      if (d.gpu.numa_node) dev->mutable_topology()->add_nodes()->set_id(*d.gpu.numa_node);
    }
    return resp;
  }

  void publish_device_counts() {  // call with mu held
    size_t healthy = 0;
    for (const auto& d : devices) healthy += health.healthy(d.gpu.uuid) ? 1 : 0;
    ctx.metrics.set_devices(healthy, devices.size() - healthy);
  }

  std::vector<HostNode> control_nodes() const {
    std::vector<HostNode> out;
    for (const auto& path : kControlNodes) {
      auto info = host.stat(path);
      if (info && info->type == FileType::char_device)
        out.push_back({path, host.resolve(path).native()});
    }
    return out;
  }
};

// The DevicePlugin service the kubelet calls.
class PluginService final : public v1beta1::DevicePlugin::Service {
 public:
  explicit PluginService(DevicePlugin::State& s, std::uint64_t generation)
      : m_s(s), m_generation(generation) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::uint64_t sent = 0;
    std::unique_lock lock(m_s.mu);
    while (true) {
      // Wake on a health change, on stop/restart, and twice a second to notice a gone kubelet.
      m_s.cv.wait_for(lock, std::chrono::milliseconds(500), [&] {
        return m_s.version != sent || m_s.stopping || m_s.generation != m_generation;
      });
      if (m_s.stopping || m_s.generation != m_generation || ctx->IsCancelled())
        return grpc::Status::OK;
      if (m_s.version == sent) continue;
      auto resp = m_s.snapshot();
      sent = m_s.version;
      lock.unlock();
      if (!writer->Write(resp)) return grpc::Status::OK;
      lock.lock();
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    PairScore score = [&](const std::string& a, const std::string& b) {
      auto it = m_s.scores.find({a, b});
      return it == m_s.scores.end() ? 0 : it->second;
    };
    for (const auto& creq : req->container_requests()) {
      std::vector<std::string> available(creq.available_deviceids().begin(),
                                         creq.available_deviceids().end());
      std::vector<std::string> must(creq.must_include_deviceids().begin(),
                                    creq.must_include_deviceids().end());
      auto chosen = preferred_allocation(available, must, creq.allocation_size(), score);
      if (!chosen) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, chosen.error().message);
      auto* cresp = out->add_container_responses();
      for (const auto& id : *chosen) cresp->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    auto start = std::chrono::steady_clock::now();
    auto status = allocate(*req, out);
    m_s.ctx.metrics.observe_allocate(std::chrono::steady_clock::now() - start, status.ok(),
                                     static_cast<size_t>(req->container_requests_size()));
    return status;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  grpc::Status allocate(const v1beta1::AllocateRequest& req, v1beta1::AllocateResponse* out) {
    // Validate every container first: a bad id refuses the whole request, nothing partial.
    std::vector<std::vector<Gpu>> granted;
    {
      std::lock_guard lock(m_s.mu);
      for (const auto& creq : req.container_requests()) {
        std::vector<std::string> ids(creq.devices_ids().begin(), creq.devices_ids().end());
        auto gpus = validate_allocation(
            ids, m_s.devices, [&](const std::string& uuid) { return m_s.health.healthy(uuid); });
        if (!gpus) {
          m_s.ctx.log.warn("plugin.allocate_refused",
                           {{"ids", join(ids, ",")}, {"error", gpus.error().message}});
          auto code = gpus.error().code == Errc::not_found ? grpc::StatusCode::NOT_FOUND
                                                           : grpc::StatusCode::INVALID_ARGUMENT;
          return grpc::Status(code, gpus.error().message);
        }
        granted.push_back(std::move(*gpus));
      }
    }
    auto control = m_s.control_nodes();
    auto host_path = [&](const std::string& p) { return m_s.host.resolve(p).native(); };
    for (const auto& gpus : granted) {
      *out->add_container_responses() =
          build_allocate_response(gpus, m_s.ctx.options, control, host_path);
      std::vector<std::string> uuids;
      for (const auto& g : gpus) uuids.push_back(g.uuid);
      m_s.ctx.log.info("plugin.allocate",
                       {{"resource", m_s.ctx.options.resource_name}, {"gpus", join(uuids, ",")}});
    }
    return grpc::Status::OK;
  }

  DevicePlugin::State& m_s;
  std::uint64_t m_generation;
};

Result<std::unique_ptr<DevicePlugin>> DevicePlugin::create(PluginContext ctx) {
  auto gpus = ctx.inventory.gpus();
  if (!gpus) return std::unexpected(gpus.error().wrap("discover GPUs"));
  std::vector<PluginDevice> devices;
  std::vector<std::string> uuids;
  for (const auto& g : *gpus) {
    devices.push_back({plugin_device_id(g, ctx.options.id_strategy), g});
    uuids.push_back(g.uuid);
  }
  std::map<std::pair<std::string, std::string>, int> scores;
  for (const auto& a : devices) {
    for (const auto& b : devices) {
      if (a.id == b.id) continue;
      auto topo = ctx.inventory.topology(a.gpu.uuid, b.gpu.uuid);
      bool same_numa = a.gpu.numa_node && a.gpu.numa_node == b.gpu.numa_node;
      scores[{a.id, b.id}] = link_score(topo ? *topo : Topology{}, same_numa);
    }
  }
  HostFs host(ctx.options.host_root);
  HealthTracker tracker(uuids, ctx.options.health);
  auto state = std::make_unique<State>(std::move(ctx), std::move(host), std::move(devices),
                                       std::move(tracker));
  state->scores = std::move(scores);
  state->publish_device_counts();
  for (const auto& d : state->devices) {
    state->ctx.log.info("plugin.device",
                        {{"id", d.id},
                         {"uuid", d.gpu.uuid},
                         {"minor", std::to_string(d.gpu.minor)},
                         {"numa", d.gpu.numa_node ? std::to_string(*d.gpu.numa_node) : "-"}});
  }
  return std::unique_ptr<DevicePlugin>(new DevicePlugin(std::move(state)));
}

DevicePlugin::DevicePlugin(std::unique_ptr<State> state) : m_state(std::move(state)) {}
DevicePlugin::~DevicePlugin() = default;

bool DevicePlugin::registered() const {
  return m_state->registered;
}
size_t DevicePlugin::device_count() const {
  return m_state->devices.size();
}

namespace {

Status register_with_kubelet(const PluginOptions& opt, const std::string& kubelet_socket) {
  auto channel =
      grpc::CreateChannel("unix://" + kubelet_socket, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version(kApiVersion);
  req.set_endpoint(opt.socket_name);
  req.set_resource_name(opt.resource_name);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty empty;
  auto status = stub->Register(&ctx, req, &empty);
  if (!status.ok())
    return fail(Errc::rpc, "register with ", kubelet_socket, ": ", status.error_message());
  return {};
}

}  // namespace

Status DevicePlugin::run(int stop_fd) {
  State& s = *m_state;
  const PluginOptions& opt = s.ctx.options;
  const std::filesystem::path dir = opt.plugin_dir;
  const std::string kubelet_socket = (dir / kKubeletSocket).string();
  const std::string own_socket = (dir / opt.socket_name).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);

  // inotify on the plugin directory: the kubelet re-creates kubelet.sock when it restarts and
  // deletes every plugin socket when it starts.
  int ino = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (ino < 0) return fail_errno("inotify_init1 for", dir.native());
  if (::inotify_add_watch(ino, dir.c_str(), IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM) <
      0) {
    ::close(ino);
    return fail_errno("inotify_add_watch", dir.native());
  }

  // Health: a thread turning NVML events into health changes.
  std::thread health_thread([&s] {
    auto alive = [&](const std::string& uuid) {
      return s.ctx.inventory.check_alive(uuid).has_value();
    };
    bool warned = false;
    while (true) {
      {
        std::lock_guard lock(s.mu);
        if (s.stopping) return;
      }
      if (!s.ctx.options.health.enabled) {
        std::unique_lock lock(s.mu);
        s.cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return s.stopping; });
        continue;
      }
      auto event = s.ctx.inventory.wait_event(std::chrono::milliseconds(200));
      auto now = std::chrono::steady_clock::now();
      std::unique_lock lock(s.mu);
      bool changed = false;
      if (!event) {
        // No usable event stream: still notice GPUs that stop answering, twice a second.
        if (!warned)
          s.ctx.log.warn("plugin.health_events_unavailable", {{"error", event.error().message}});
        warned = true;
        changed |= s.health.on_event(GpuEvent{"", 0, true}, now, alive);
        s.cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return s.stopping; });
      } else if (event->has_value()) {
        const GpuEvent& ev = **event;
        changed |= s.health.on_event(ev, now, alive);
        s.ctx.log.info(
            "plugin.gpu_event",
            {{"uuid", ev.uuid},
             {"xid", std::to_string(ev.xid)},
             {"lost", ev.gpu_lost ? "true" : "false"},
             {"ignored", s.ctx.options.health.ignored_xids.contains(ev.xid) && !ev.gpu_lost
                             ? "true"
                             : "false"}});
      }
      changed |= s.health.on_tick(now, alive);
      if (changed) {
        ++s.version;
        s.publish_device_counts();
        for (const auto& d : s.devices) {
          s.ctx.log.info("plugin.health",
                         {{"id", d.id},
                          {"uuid", d.gpu.uuid},
                          {"health", s.health.healthy(d.gpu.uuid) ? "Healthy" : "Unhealthy"},
                          {"reason", s.health.reason(d.gpu.uuid)}});
        }
        s.cv.notify_all();
      }
    }
  });

  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<PluginService> service;

  auto stop_server = [&] {
    if (!server) return;
    {
      std::lock_guard lock(s.mu);
      ++s.generation;  // ends this server's ListAndWatch streams
      s.cv.notify_all();
    }
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    server.reset();
    service.reset();
    s.registered = false;
    std::filesystem::remove(own_socket, ec);
  };

  auto start_server = [&]() -> Status {
    std::filesystem::remove(own_socket, ec);  // a stale socket from a crash
    std::uint64_t gen;
    {
      std::lock_guard lock(s.mu);
      gen = s.generation;
    }
    service = std::make_unique<PluginService>(s, gen);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix://" + own_socket, grpc::InsecureServerCredentials());
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    if (!server) {
      service.reset();
      return fail(Errc::rpc, "cannot serve on ", own_socket);
    }
    return {};
  };

  bool waiting_logged = false;
  auto retry_at = std::chrono::steady_clock::now();
  Status result;
  while (true) {
    // Serve and register whenever the kubelet is there and we are not registered.
    if (!s.registered && std::chrono::steady_clock::now() >= retry_at) {
      if (std::filesystem::exists(kubelet_socket, ec)) {
        waiting_logged = false;
        Status st = server ? Status{} : start_server();
        if (st) st = register_with_kubelet(opt, kubelet_socket);
        if (st) {
          s.registered = true;
          s.ctx.metrics.count_registration();
          s.ctx.log.info("plugin.registered", {{"resource", opt.resource_name},
                                               {"endpoint", own_socket},
                                               {"kubelet", kubelet_socket},
                                               {"devices", std::to_string(s.devices.size())}});
        } else {
          s.ctx.log.warn("plugin.register_failed",
                         {{"error", st.error().message}, {"retry_in", "1s"}});
          stop_server();
          retry_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        }
      } else if (!waiting_logged) {
        s.ctx.log.info("plugin.waiting_for_kubelet", {{"socket", kubelet_socket}});
        waiting_logged = true;
      }
    }

    pollfd fds[2] = {{stop_fd, POLLIN, 0}, {ino, POLLIN, 0}};
    int timeout = s.registered ? -1 : 200;
    if (::poll(fds, 2, timeout) < 0 && errno != EINTR) {
      result = fail_errno("poll", dir.native());
      break;
    }
    if (fds[0].revents) break;
    if (!(fds[1].revents & POLLIN)) continue;

    bool restart = false;
    alignas(inotify_event) char buf[8192];
    ssize_t n;
    while ((n = ::read(ino, buf, sizeof buf)) > 0) {
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        std::string name = ev->len ? ev->name : "";
        if (name == kKubeletSocket && (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
          s.ctx.metrics.count_kubelet_restart();
          s.ctx.log.info("plugin.kubelet_restarted", {{"socket", kubelet_socket}});
          restart = true;
        } else if (name == opt.socket_name && (ev->mask & (IN_DELETE | IN_MOVED_FROM))) {
          // Judge by the state now, not by the event: our own stop/start and gRPC itself
          // unlink this path too. Only a socket gone from under a running server means the
          // kubelet wiped the directory.
          if (server && !std::filesystem::exists(own_socket, ec)) {
            s.ctx.log.info("plugin.socket_removed", {{"socket", own_socket}});
            restart = true;
          }
        }
        p += sizeof(inotify_event) + ev->len;
      }
    }
    if (restart) {
      stop_server();
      retry_at = std::chrono::steady_clock::now();
    }
  }

  // Stop: end the streams, shut the server down within a second, remove the socket.
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
    s.cv.notify_all();
  }
  stop_server();
  health_thread.join();
  ::close(ino);
  s.ctx.log.info("plugin.stopped", {{"socket", own_socket}});
  return result;
}

}  // namespace gpufence
