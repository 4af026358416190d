#include "test_kubelet.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "common/process.hpp"

extern char** environ;

namespace gpufence::test {

class TestKubelet::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(TestKubelet& k) : m_k(k) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                        v1beta1::Empty*) override {
    // The real kubelet refuses versions it does not support and bad resource names.
    if (req->version() != "v1beta1") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "unsupported version " + req->version());
    }
    if (req->resource_name().find('/') == std::string::npos) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "invalid resource name " + req->resource_name());
    }
    return m_k.on_register(*req);
  }

 private:
  TestKubelet& m_k;
};

// One registration's client in upstream mode (handler.go connectClient/runClient, client.go).
struct TestKubelet::Client {
  int number = 0;     // which registration, 1-based
  long instance = 0;  // the kubelet start it belongs to
  std::string resource;
  std::shared_ptr<grpc::Channel> channel;
  grpc::ClientContext stream;  // the ListAndWatch call; cancelling it is Disconnect's Close
  std::thread thread;          // runClient
  bool disconnected = false;   // its connection closed: nothing more it reads counts
};

TestKubelet::TestKubelet(std::filesystem::path plugin_dir) : m_dir(std::move(plugin_dir)) {
  std::filesystem::create_directories(m_dir);
}

TestKubelet::~TestKubelet() {
  stop();
}

void TestKubelet::emulate_upstream_run_client(std::chrono::milliseconds reaction) {
  std::lock_guard lock(m_mu);
  m_upstream = true;
  m_reaction = reaction;
}

void TestKubelet::start() {
  {
    std::lock_guard lock(m_mu);
    ++m_instance;
    m_stopping = false;
  }
  // The kubelet's device manager removes every file in the plugin directory when it starts.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(m_dir, ec)) {
    if (entry.is_socket(ec)) std::filesystem::remove(entry.path(), ec);
  }
  m_service = std::make_unique<RegistrationService>(*this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + (m_dir / "kubelet.sock").string(),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(m_service.get());
  m_server = builder.BuildAndStart();
}

void TestKubelet::stop() {
  {
    std::unique_lock lock(m_mu);
    if (m_upstream) {
      lock.unlock();
      return stop_upstream();
    }
  }
  // The server first: once it is down no Register can start another stream behind our back.
  if (m_server) {
    m_server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    m_server.reset();
  }
  {
    std::lock_guard stream_lock(m_stream_mu);
    if (m_stream_ctx) m_stream_ctx->TryCancel();
    if (m_stream_thread.joinable()) m_stream_thread.join();
    m_stream_ctx.reset();
  }
  m_service.reset();
  std::error_code ec;
  std::filesystem::remove(m_dir / "kubelet.sock", ec);
  std::lock_guard lock(m_mu);
  m_devices.clear();
  m_plugin_channel.reset();
}

void TestKubelet::drop_stream() {
  {
    std::lock_guard lock(m_mu);
    if (m_upstream) {
      // The connection to the current client breaks; runClient reacts as it always does.
      for (auto& [name, c] : m_clients) c->stream.TryCancel();
      return;
    }
  }
  {
    std::lock_guard stream_lock(m_stream_mu);
    if (m_stream_ctx) m_stream_ctx->TryCancel();
    if (m_stream_thread.joinable()) m_stream_thread.join();
    m_stream_ctx.reset();
  }
  std::lock_guard lock(m_mu);
  m_devices.clear();
}

grpc::Status TestKubelet::on_register(const v1beta1::RegisterRequest& req) {
  bool upstream;
  {
    std::lock_guard lock(m_mu);
    upstream = m_upstream;
    if (!upstream) {
      ++m_registrations;
      m_last = req;
    }
  }
  if (upstream) return on_register_upstream(req);
  // Dial the plugin back and consume ListAndWatch, as the kubelet's endpoint does.
  std::lock_guard stream_lock(m_stream_mu);
  if (m_stream_ctx) m_stream_ctx->TryCancel();
  if (m_stream_thread.joinable()) m_stream_thread.join();
  auto channel = grpc::CreateChannel("unix://" + (m_dir / req.endpoint()).string(),
                                     grpc::InsecureChannelCredentials());
  m_stream_ctx = std::make_unique<grpc::ClientContext>();
  grpc::ClientContext* ctx = m_stream_ctx.get();
  {
    std::lock_guard lock(m_mu);
    m_plugin_channel = channel;
  }
  m_stream_thread = std::thread([this, channel, ctx] {
    auto stub = v1beta1::DevicePlugin::NewStub(channel);
    {
      grpc::ClientContext opt_ctx;
      opt_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1beta1::DevicePluginOptions options;
      stub->GetDevicePluginOptions(&opt_ctx, v1beta1::Empty(), &options);
    }
    auto reader = stub->ListAndWatch(ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
      std::lock_guard lock(m_mu);
      set_devices(resp);
    }
    reader->Finish();
  });
  return grpc::Status::OK;
}

void TestKubelet::set_devices(const v1beta1::ListAndWatchResponse& resp) {
  m_devices.clear();
  m_numa.clear();
  for (const auto& d : resp.devices()) {
    m_devices[d.id()] = d.health();
    for (const auto& n : d.topology().nodes()) m_numa[d.id()].push_back(n.id());
  }
  m_cv.notify_all();
}

// connectClient: registerClient (replacing, not ending, the current client), then Connect (dial,
// GetDevicePluginOptions); a failed Connect deregisters it and fails the Register; then runClient
// on its own thread.
grpc::Status TestKubelet::on_register_upstream(const v1beta1::RegisterRequest& req) {
  auto c = std::make_shared<Client>();
  c->resource = req.resource_name();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, as a ClientConn
  c->channel = grpc::CreateCustomChannel("unix://" + (m_dir / req.endpoint()).string(),
                                         grpc::InsecureChannelCredentials(), args);
  {
    std::lock_guard lock(m_mu);
    if (m_stopping) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet stopping");
    ++m_registrations;
    m_last = req;
    c->number = m_registrations;
    c->instance = m_instance;
    m_clients[c->resource] = c;
    m_all_clients.push_back(c);
    m_plugin_channel = c->channel;
    m_cv.notify_all();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::DevicePluginOptions options;
  auto st = v1beta1::DevicePlugin::NewStub(c->channel)
                ->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &options);
  std::lock_guard lock(m_mu);
  if (!st.ok()) {
    if (auto it = m_clients.find(c->resource); it != m_clients.end() && it->second == c)
      m_clients.erase(it);
    return st;
  }
  if (m_stopping || c->instance != m_instance)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet stopping");
  c->thread = std::thread([this, c] { run_client(c); });
  return grpc::Status::OK;
}

// runClient: Run (ListAndWatch until it ends), then disconnect the client current for the name.
void TestKubelet::run_client(const std::shared_ptr<Client>& c) {
  auto reader = v1beta1::DevicePlugin::NewStub(c->channel)->ListAndWatch(&c->stream, {});
  v1beta1::ListAndWatchResponse resp;
  while (reader->Read(&resp)) {
    std::lock_guard lock(m_mu);
    if (!m_stopping && c->instance == m_instance && !c->disconnected) set_devices(resp);
  }
  reader->Finish();
  std::unique_lock lock(m_mu);
  ++m_streams_ended;
  m_cv.notify_all();
  auto gone = [&] { return m_stopping || c->instance != m_instance; };  // that process is dead
  m_cv.wait_for(lock, m_reaction, gone);
  if (gone()) return;
  auto it = m_clients.find(c->resource);  // s.getClient(name): the current one, maybe not c
  if (it == m_clients.end()) return;
  auto current = it->second;
  m_clients.erase(it);  // deregisterClient
  disconnect(*current);
}

// client.Disconnect: close its connection (its stream ends), then PluginDisconnected: every
// device of the resource Unhealthy (markResourceUnhealthy).
void TestKubelet::disconnect(Client& c) {
  c.disconnected = true;
  c.stream.TryCancel();
  ++m_disconnects;
  for (auto& [id, health] : m_devices) health = "Unhealthy";
  m_cv.notify_all();
}

// Stop: disconnect every client, then stop serving; the process then exits, so every other
// connection ends and no goroutine of it acts again.
void TestKubelet::stop_upstream() {
  std::vector<std::shared_ptr<Client>> clients;
  {
    std::lock_guard lock(m_mu);
    for (auto& [name, c] : m_clients) disconnect(*c);
    m_clients.clear();
    m_stopping = true;
    clients.swap(m_all_clients);
    m_cv.notify_all();
  }
  if (m_server) {
    m_server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    m_server.reset();
  }
  for (auto& c : clients) {
    c->stream.TryCancel();
    if (c->thread.joinable()) c->thread.join();
  }
  m_service.reset();
  std::error_code ec;
  std::filesystem::remove(m_dir / "kubelet.sock", ec);
  std::lock_guard lock(m_mu);
  m_devices.clear();
  m_plugin_channel.reset();
}

grpc::Status TestKubelet::register_plugin(const v1beta1::RegisterRequest& req) {
  auto stub = v1beta1::Registration::NewStub(grpc::CreateChannel(
      "unix://" + (m_dir / "kubelet.sock").string(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty out;
  return stub->Register(&ctx, req, &out);
}

bool TestKubelet::end_stream_of(int n) {
  std::lock_guard lock(m_mu);
  for (auto& c : m_all_clients) {
    if (c->number != n) continue;
    c->stream.TryCancel();
    return true;
  }
  return false;
}

int TestKubelet::streams_ended() const {
  std::lock_guard lock(m_mu);
  return m_streams_ended;
}

int TestKubelet::disconnects() const {
  std::lock_guard lock(m_mu);
  return m_disconnects;
}

bool TestKubelet::wait_disconnects(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(m_mu);
  return m_cv.wait_for(lock, timeout, [&] { return m_disconnects >= count; });
}

bool TestKubelet::wait_allocatable(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(m_mu);
  return m_cv.wait_for(lock, timeout, [&] {
    return m_devices.size() == n && healthy(m_devices) == n && (!m_upstream || !m_clients.empty());
  });
}

size_t TestKubelet::healthy(const Devices& d) {
  return static_cast<size_t>(
      std::count_if(d.begin(), d.end(), [](const auto& e) { return e.second == "Healthy"; }));
}

int TestKubelet::registrations() const {
  std::lock_guard lock(m_mu);
  return m_registrations;
}

v1beta1::RegisterRequest TestKubelet::last_registration() const {
  std::lock_guard lock(m_mu);
  return m_last;
}

bool TestKubelet::wait_registrations(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(m_mu);
  return m_cv.wait_for(lock, timeout, [&] { return m_registrations >= count; }) ||
         m_registrations >= count;
}

TestKubelet::Devices TestKubelet::devices() const {
  std::lock_guard lock(m_mu);
  return m_devices;
}

std::map<std::string, std::vector<long>> TestKubelet::numa_nodes() const {
  std::lock_guard lock(m_mu);
  return m_numa;
}

bool TestKubelet::wait_devices(const std::function<bool(const Devices&)>& pred,
                               std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(m_mu);
  while (!pred(m_devices)) {
    if (m_cv.wait_until(lock, deadline) == std::cv_status::timeout) return pred(m_devices);
  }
  return true;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> TestKubelet::plugin_stub() {
  std::lock_guard lock(m_mu);
  if (!m_plugin_channel) return nullptr;
  return v1beta1::DevicePlugin::NewStub(m_plugin_channel);
}

grpc::Status TestKubelet::preferred(const std::vector<std::string>& available,
                                    const std::vector<std::string>& must_include, int size,
                                    std::vector<std::string>* out) {
  auto stub = plugin_stub();
  if (!stub) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no plugin registered");
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  for (const auto& id : available) c->add_available_deviceids(id);
  for (const auto& id : must_include) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::PreferredAllocationResponse resp;
  auto st = stub->GetPreferredAllocation(&ctx, req, &resp);
  if (st.ok() && out) {
    out->assign(resp.container_responses(0).deviceids().begin(),
                resp.container_responses(0).deviceids().end());
  }
  return st;
}

grpc::Status TestKubelet::allocate(const std::vector<std::vector<std::string>>& containers,
                                   v1beta1::AllocateResponse* out) {
  auto stub = plugin_stub();
  if (!stub) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no plugin registered");
  ++m_allocate_calls;
  v1beta1::AllocateRequest req;
  for (const auto& ids : containers) {
    auto* c = req.add_container_requests();
    for (const auto& id : ids) c->add_devices_ids(id);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return stub->Allocate(&ctx, req, out);
}

std::vector<std::string> choose_devices(const std::vector<std::string>& reusable,
                                        const std::vector<std::string>& available,
                                        const std::vector<std::string>& preferred, int count) {
  std::vector<std::string> chosen;
  auto take_from = [&](const std::vector<std::string>& ids, const std::vector<std::string>* only) {
    for (const auto& id : ids) {
      if (static_cast<int>(chosen.size()) == count) return;
      if (only && std::find(only->begin(), only->end(), id) == only->end()) continue;
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
  };
  take_from(reusable, nullptr);
  take_from(preferred, &available);  // a preferred id that is not free never counts
  take_from(available, nullptr);
  if (static_cast<int>(chosen.size()) < count) chosen.clear();
  return chosen;
}

grpc::Status TestKubelet::admit(int count, v1beta1::ContainerAllocateResponse* out,
                                std::vector<std::string>* ids,
                                const std::vector<std::string>& reusable) {
  std::vector<std::string> chosen(reusable.begin(),
                                  reusable.begin() + std::min<size_t>(reusable.size(), count));
  if (static_cast<int>(chosen.size()) < count) {
    std::vector<std::string> available;
    for (const auto& [id, health] : devices()) {
      if (health == "Healthy" &&
          std::find(m_assigned.begin(), m_assigned.end(), id) == m_assigned.end() &&
          std::find(chosen.begin(), chosen.end(), id) == chosen.end()) {
        available.push_back(id);
      }
    }
    if (static_cast<int>(available.size() + chosen.size()) < count) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "not enough healthy devices");
    }
    // The kubelet offers the free devices plus those already chosen (which must be included).
    std::vector<std::string> offered = available;
    offered.insert(offered.end(), chosen.begin(), chosen.end());
    std::vector<std::string> preferred;
    auto st = this->preferred(offered, chosen, count, &preferred);
    if (!st.ok()) return st;
    chosen = choose_devices(chosen, available, preferred, count);
  }
  v1beta1::AllocateResponse resp;
  auto st = allocate({chosen}, &resp);
  if (!st.ok()) return st;
  if (resp.container_responses_size() != 1)
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "Allocate answered for " + std::to_string(resp.container_responses_size()) +
                            " containers, asked for 1");
  for (const auto& id : chosen) {
    if (std::find(m_assigned.begin(), m_assigned.end(), id) == m_assigned.end())
      m_assigned.push_back(id);
  }
  if (out) *out = resp.container_responses(0);
  if (ids) *ids = chosen;
  return st;
}

void TestKubelet::assign(const std::vector<std::string>& ids) {
  for (const auto& id : ids) {
    if (std::find(m_assigned.begin(), m_assigned.end(), id) == m_assigned.end())
      m_assigned.push_back(id);
  }
}

void TestKubelet::release(const std::vector<std::string>& ids) {
  std::erase_if(m_assigned, [&](const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  });
}

Subprocess::Subprocess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       const std::string& log_path) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  envs.insert(envs.end(), env.begin(), env.end());
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return;  // m_pid stays -1: not running
  // Children start with the default signal mask, whatever the test's threads block.
  auto pid = spawn_process(argv, {.env = envs, .stdin_fd = -1, .stdout_fd = log, .stderr_fd = log});
  ::close(log);
  m_pid = pid ? *pid : -1;
}

Subprocess::~Subprocess() {
  if (m_pid > 0 && !m_reaped) signal_and_wait(SIGKILL, std::chrono::milliseconds(2000));
}

bool Subprocess::running() {
  if (m_pid <= 0 || m_reaped) return false;
  int status = 0;
  if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
    m_reaped = true;
    m_status = status;
    return false;
  }
  return true;
}

int Subprocess::signal_and_wait(int sig, std::chrono::milliseconds timeout) {
  if (m_pid <= 0) return -1;
  if (m_reaped) return WIFEXITED(m_status) ? WEXITSTATUS(m_status) : 128 + WTERMSIG(m_status);
  ::kill(m_pid, sig);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
      m_reaped = true;
      m_status = status;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

}  // namespace gpufence::test
