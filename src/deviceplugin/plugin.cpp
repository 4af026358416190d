#include "deviceplugin/plugin.hpp"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "common/hostfs.hpp"
#include "common/strings.hpp"
#include "deviceplugin/allocate.hpp"
#include "deviceplugin/api.hpp"
#include "deviceplugin/cdi_spec.hpp"
#include "deviceplugin/health_monitor.hpp"
#include "deviceplugin/preferred.hpp"
#include "deviceplugin/registration.hpp"
#include "gpu/wire_contract.hpp"

namespace gpufence {

namespace {

constexpr const char* kKubeletSocket = "kubelet.sock";
constexpr const char* kApiVersion = "v1beta1";

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
  std::unique_ptr<HealthMonitor> monitor;
  std::unique_ptr<RegistrationLoop> loop;

  // Guards what the ListAndWatch streams wait on. Never held across NVML: the health monitor
  // owns every NVML call and only takes this lock to bump the version.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::uint64_t version = 1;     // bumped on every health change
  std::uint64_t generation = 0;  // bumped when the gRPC server is stopped
  bool stopping = false;
  int open_streams = 0;
  StreamLedger streams;  // which registration each stream belongs to
  std::chrono::steady_clock::time_point streams_idle_since = std::chrono::steady_clock::now();

  // The gRPC server; touched only by the registration loop's thread.
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1beta1::DevicePlugin::Service> service;

  State(PluginContext c, HostFs h, std::vector<PluginDevice> d)
      : ctx(std::move(c)), host(std::move(h)), devices(std::move(d)) {}

  std::string own_socket() const {
    return (std::filesystem::path(ctx.options.plugin_dir) / ctx.options.socket_name).string();
  }
  std::string kubelet_socket() const {
    return (std::filesystem::path(ctx.options.plugin_dir) / kKubeletSocket).string();
  }

  v1beta1::ListAndWatchResponse snapshot() const {  // call with mu held
    v1beta1::ListAndWatchResponse resp;
    for (const auto& d : devices) {
      auto* dev = resp.add_devices();
      dev->set_id(d.id);
      dev->set_health(monitor->healthy(d.gpu.uuid) ? "Healthy" : "Unhealthy");
      if (d.gpu.numa_node) dev->mutable_topology()->add_nodes()->set_id(*d.gpu.numa_node);
    }
    return resp;
  }

  void publish_device_counts() {
    size_t healthy = 0;
    for (const auto& d : devices) healthy += monitor->healthy(d.gpu.uuid) ? 1 : 0;
    ctx.metrics.set_devices(healthy, devices.size() - healthy);
  }

  // Each health change once: a log line, and the context's hook (the Node Event).
  void tell_transitions() {
    for (const auto& tr : monitor->take_transitions()) {
      const Gpu* gpu = nullptr;
      for (const auto& d : devices)
        if (d.gpu.uuid == tr.uuid) gpu = &d.gpu;
      if (!gpu) continue;
      ctx.log.info("plugin.health_transition", {{"uuid", tr.uuid},
                                                {"index", std::to_string(gpu->index)},
                                                {"health", tr.healthy ? "Healthy" : "Unhealthy"},
                                                {"reason", tr.reason}});
      if (ctx.on_transition) ctx.on_transition(*gpu, tr);
    }
  }

  std::vector<GpuMetricRow> metric_rows() const {
    std::vector<GpuMetricRow> rows;
    for (const auto& h : monitor->report()) {
      GpuMetricRow row{{}, h};
      for (const auto& d : devices)
        if (d.gpu.uuid == h.uuid) row.gpu = d.gpu;
      if (h.uuid.empty() || !row.gpu.uuid.empty()) rows.push_back(std::move(row));
    }
    return rows;
  }

  // The health monitor's change callback: wake every ListAndWatch stream.
  void on_health_change() {
    tell_transitions();
    publish_device_counts();
    std::lock_guard lock(mu);
    ++version;
    cv.notify_all();
  }

  std::optional<std::chrono::steady_clock::time_point> idle_since() const {
    std::lock_guard lock(mu);
    if (open_streams > 0) return std::nullopt;
    return streams_idle_since;
  }

  StreamNews take_stream_news() {
    std::lock_guard lock(mu);
    return streams.take_news();
  }

  // Ends every stream of the registrations so far (the loop registers anew after this).
  void retire_streams() {
    std::lock_guard lock(mu);
    streams.retire_all();
    cv.notify_all();
  }

  // Every open stream sends the device list again.
  void resend_devices() {
    std::lock_guard lock(mu);
    ++version;
    cv.notify_all();
  }

  PluginCdiSpecOptions cdi_spec_options() const {
    PluginCdiSpecOptions o;
    o.dir = ctx.options.cdi_spec_dir;
    o.hook_path = ctx.options.cdi_hook_path;
    o.dev_root = ctx.options.dev_root;
    o.driver_root = ctx.options.driver_root;
    return o;
  }
  // The spec built at start from the GPUs found (they do not change while the plugin runs: a
  // new GPU set means a restart, which builds it again); nullopt when off or there are no GPUs.
  std::optional<CdiSpec> cdi_spec;
  Status build_cdi_spec();
  Status write_cdi_spec();

  Status serve();
  void stop_serving();
  Status register_now();
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

  // The full device list at once on a new stream (the kubelet counts nothing as allocatable
  // until it has one), then again on every health change. The stream ends when the kubelet
  // cancels it, on stop or restart, and when its registration is retired (registration.hpp).
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::uint64_t sent = 0;
    std::unique_lock lock(m_s.mu);
    ++m_s.open_streams;
    const std::uint64_t registration = m_s.streams.opened();
    auto ours = [&] {
      return m_s.stopping || m_s.generation != m_generation || m_s.streams.retired(registration);
    };
    struct Closed {  // counts the stream closed however the handler returns
      DevicePlugin::State& s;
      std::unique_lock<std::mutex>& lock;
      std::uint64_t registration;
      std::function<bool()> ours;
      ~Closed() {
        if (!lock.owns_lock()) lock.lock();
        if (--s.open_streams == 0) s.streams_idle_since = std::chrono::steady_clock::now();
        if (s.streams.closed(registration, ours())) s.loop->wake();
      }
    } closed{m_s, lock, registration, ours};
    while (true) {
      // Wake on a health change, on stop/restart/retirement, and five times a second to notice
      // a kubelet that cancelled the stream (a sync server has no callback for that).
      m_s.cv.wait_for(lock, std::chrono::milliseconds(200),
                      [&] { return m_s.version != sent || ours(); });
      if (ours() || ctx->IsCancelled()) return grpc::Status::OK;
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
    // No lock: the devices never change after start-up and the monitor guards health itself.
    std::vector<std::vector<Gpu>> granted;
    {
      for (const auto& creq : req.container_requests()) {
        std::vector<std::string> ids(creq.devices_ids().begin(), creq.devices_ids().end());
        auto gpus = validate_allocation(
            ids, m_s.devices, [&](const std::string& uuid) { return m_s.monitor->healthy(uuid); });
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
    auto control = present_control_nodes(m_s.host);
    for (const auto& gpus : granted) {
      *out->add_container_responses() = build_allocate_response(gpus, m_s.ctx.options, control);
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

namespace {

// Discovery (at start-up only) may take long on a big node without persistence mode, where each
// NVML call can initialise a GPU; a hang still ends in an error, and SIGTERM ends it at once.
constexpr int kStartupDeadlineFactor = 6;

}  // namespace

Result<std::unique_ptr<DevicePlugin>> DevicePlugin::create(PluginContext ctx, int stop_fd) {
  NvmlWatchdog& nvml = ctx.watchdog;
  const auto startup = nvml.deadline() * kStartupDeadlineFactor;
  GpuInventory& inventory = ctx.inventory;
  // Calls on the watchdog capture by value or the inventory itself: a call abandoned on a hang
  // may run on after this function has returned.
  auto gpus = nvml.call<Result<std::vector<Gpu>>>(
      "nvmlDeviceGetCount_v2 and the GPU queries", [&inventory] { return inventory.gpus(); },
      stop_fd, startup);
  if (!gpus) return std::unexpected(gpus.error().wrap("discover GPUs"));
  std::vector<PluginDevice> devices;
  std::vector<MonitoredGpu> monitored;
  for (const auto& g : *gpus) {
    devices.push_back({plugin_device_id(g, ctx.options.id_strategy), g});
    monitored.push_back({devices.back().id, g.uuid});
  }
  std::map<std::pair<std::string, std::string>, int> scores;
  for (const auto& a : devices) {
    for (const auto& b : devices) {
      if (a.id == b.id) continue;
      auto topo = nvml.call<Result<Topology>>(
          "nvmlDeviceGetTopologyCommonAncestor " + a.gpu.uuid,
          [&inventory, ua = a.gpu.uuid, ub = b.gpu.uuid] { return inventory.topology(ua, ub); },
          stop_fd, startup);
      // A failed query scores the pair as unconnected, unless NVML is stuck in it (a hang, or a
      // stop while waiting): then give up on start-up.
      if (!topo && !nvml.wait_idle(std::chrono::milliseconds(0)))
        return std::unexpected(topo.error().wrap("GPU topology"));
      bool same_numa = a.gpu.numa_node && a.gpu.numa_node == b.gpu.numa_node;
      scores[{a.id, b.id}] = link_score(topo ? *topo : Topology{}, same_numa);
    }
  }
  HostFs host(ctx.options.host_root);
  auto state = std::make_unique<State>(std::move(ctx), std::move(host), std::move(devices));
  State& s = *state;
  s.scores = std::move(scores);
  s.monitor = std::make_unique<HealthMonitor>(s.ctx.inventory, s.ctx.watchdog, monitored,
                                              s.ctx.options.health, s.ctx.log,
                                              [&s] { s.on_health_change(); });
  RegistrationSettings settings;
  settings.plugin_dir = s.ctx.options.plugin_dir;
  settings.kubelet_socket = kKubeletSocket;
  settings.own_socket = s.ctx.options.socket_name;
  settings.reregister_after = s.ctx.options.reregister_after;
  RegistrationHooks hooks{
      .serve = [&s] { return s.serve(); },
      .stop_serving = [&s] { s.stop_serving(); },
      .register_now = [&s] { return s.register_now(); },
      .streams_idle_since = [&s] { return s.idle_since(); },
      .take_stream_news = [&s] { return s.take_stream_news(); },
      .retire_streams = [&s] { s.retire_streams(); },
      .resend_devices = [&s] { s.resend_devices(); },
  };
  s.loop = std::make_unique<RegistrationLoop>(std::move(settings), std::move(hooks), s.ctx.log,
                                              s.ctx.metrics);
  if (auto st = s.build_cdi_spec(); !st) return std::unexpected(st.error());
  if (auto st = s.write_cdi_spec(); !st) return std::unexpected(st.error());
  s.publish_device_counts();
  for (const auto& d : s.devices) {
    s.ctx.log.info("plugin.device",
                   {{"id", d.id},
                    {"uuid", d.gpu.uuid},
                    {"minor", std::to_string(d.gpu.minor)},
                    {"numa", d.gpu.numa_node ? std::to_string(*d.gpu.numa_node) : "-"}});
  }
  // Last, after every step that can fail: the rows name this state, which lives as long as the
  // plugin (its destructor takes them back).
  s.ctx.metrics.set_gpu_rows([&s] { return s.metric_rows(); });
  return std::unique_ptr<DevicePlugin>(new DevicePlugin(std::move(state)));
}

DevicePlugin::DevicePlugin(std::unique_ptr<State> state) : m_state(std::move(state)) {}
DevicePlugin::~DevicePlugin() {
  if (m_state) m_state->ctx.metrics.set_gpu_rows(nullptr);  // its rows name this plugin's state
}

bool DevicePlugin::registered() const {
  return m_state->loop->registered();
}

Status DevicePlugin::State::build_cdi_spec() {
  const PluginOptions& opt = ctx.options;
  if (opt.cdi_spec_dir.empty()) {
    if (opt.list_strategies.contains(ListStrategy::cdi_annotations) ||
        opt.list_strategies.contains(ListStrategy::cdi_cri)) {
      ctx.log.warn(
          "plugin.cdi_spec_off",
          {{"reason", cat("--cdi-spec-dir is empty: a containerd with CDI on fails every GPU pod "
                          "unless a spec for ",
                          kCdiKind, " is provided")}});
    }
    return {};
  }
  if (devices.empty()) {
    ctx.log.info("plugin.cdi_spec_skipped", {{"reason", "no GPUs"}});
    return {};
  }
  std::vector<Gpu> gpus;
  for (const auto& d : devices) gpus.push_back(d.gpu);
  auto built = build_plugin_cdi_spec(host, gpus, cdi_spec_options());
  if (!built) return std::unexpected(built.error());
  for (const auto& w : built->warnings) ctx.log.warn("plugin.cdi_spec_warning", {{"detail", w}});
  cdi_spec = std::move(built->spec);
  return {};
}

// Writes the spec when it is missing or differs (someone removed or edited it); called at start
// and at every registration, so a kubelet restart also restores it.
Status DevicePlugin::State::write_cdi_spec() {
  if (!cdi_spec) return {};
  const auto o = cdi_spec_options();
  auto written = write_plugin_cdi_spec(*cdi_spec, o);
  if (!written)
    return std::unexpected(
        written.error().wrap("--cdi-spec-dir (\"\" disables the plugin's CDI spec)"));
  if (*written == SpecWrite::written) {
    ctx.log.info("plugin.cdi_spec", {{"path", plugin_cdi_spec_path(o).string()},
                                     {"devices", std::to_string(cdi_spec->devices.size())}});
  }
  if (auto removed = remove_legacy_plugin_cdi_spec(o); !removed) {
    ctx.log.warn("plugin.cdi_spec_legacy", {{"error", removed.error().message}});
  } else if (*removed) {
    ctx.log.info(
        "plugin.cdi_spec_legacy_removed",
        {{"file", kLegacyPluginCdiSpecFile},
         {"reason", cat("its ", kNvidiaCdiKind, " names conflict with NVIDIA's toolkit")}});
  }
  return {};
}

Status DevicePlugin::State::serve() {
  std::error_code ec;
  std::filesystem::remove(own_socket(), ec);  // a stale socket from a crash
  std::uint64_t gen;
  {
    std::lock_guard lock(mu);
    gen = generation;
  }
  service = std::make_unique<PluginService>(*this, gen);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + own_socket(), grpc::InsecureServerCredentials());
  builder.RegisterService(service.get());
  server = builder.BuildAndStart();
  if (!server) {
    service.reset();
    return fail(Errc::rpc, "cannot serve on ", own_socket());
  }
  return {};
}

void DevicePlugin::State::stop_serving() {
  if (!server) return;
  {
    std::lock_guard lock(mu);
    ++generation;  // ends this server's ListAndWatch streams
    cv.notify_all();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  server.reset();
  service.reset();
  std::error_code ec;
  std::filesystem::remove(own_socket(), ec);
}

Status DevicePlugin::State::register_now() {
  const PluginOptions& opt = ctx.options;
  auto channel =
      grpc::CreateChannel("unix://" + kubelet_socket(), grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version(kApiVersion);
  req.set_endpoint(opt.socket_name);
  req.set_resource_name(opt.resource_name);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext rpc;
  rpc.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty empty;
  {
    // Before Register is sent: the kubelet opens ListAndWatch from inside its Register handler,
    // perhaps before the answer reaches us; that stream is this registration's.
    std::lock_guard lock(mu);
    streams.begin_registration();
  }
  auto status = stub->Register(&rpc, req, &empty);
  if (!status.ok())
    return fail(Errc::rpc, "register with ", kubelet_socket(), ": ", status.error_message());
  ctx.metrics.count_registration();
  if (auto st = write_cdi_spec(); !st)
    ctx.log.error("plugin.cdi_spec_failed", {{"error", st.error().message}});
  ctx.log.info("plugin.registered", {{"resource", opt.resource_name},
                                     {"endpoint", own_socket()},
                                     {"kubelet", kubelet_socket()},
                                     {"devices", std::to_string(devices.size())}});
  return {};
}

// Two named parts run side by side: the health monitor on its own thread, the registration loop
// on this one until the stop fd fires. Stopping ends every stream, shuts the server down within
// a second and removes the socket; neither part waits on NVML.
Status DevicePlugin::run(int stop_fd) {
  State& s = *m_state;
  if (auto st = s.monitor->start(); !st) return st;
  Status result = s.loop->run(stop_fd);
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
    s.cv.notify_all();
  }
  s.stop_serving();
  s.monitor->stop();
  s.ctx.log.info("plugin.stopped", {{"socket", s.own_socket()}});
  return result;
}

}  // namespace gpufence
