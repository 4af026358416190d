#include "dra/driver.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "dra/v1/api.grpc.pb.h"
#include "drahealth/v1alpha1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace gpufence {

namespace dra = k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

constexpr std::string_view kCheckpointFile = "checkpoint.json";
// The service names the kubelet takes in supported_versions (docs/dra.md): v1 only; the kubelet
// picks the first it knows in our order.
constexpr std::string_view kDraService = "v1.DRAPlugin";

std::string claim_text(const dra::Claim& c) {
  return cat(c.namespace_(), "/", c.name());
}

// Whether a process accepts connections on the unix socket at `path`.
bool socket_answers(const std::filesystem::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string p = path.string();
  if (p.size() >= sizeof addr.sun_path) {
    ::close(fd);
    return false;
  }
  std::memcpy(addr.sun_path, p.c_str(), p.size() + 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::string dra_socket_name(const DraIdentity& id) {
  return cat(id.driver, "-reg.sock");
}

struct DraDriver::State {
  DraOptions opt;
  KubeClient& kube;
  std::vector<Gpu> gpus;
  Logger& log;
  DraHealthView health_view;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::map<std::string, DraPreparedClaim> prepared;  // by claim UID
  std::uint64_t health_version = 0;
  int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // check the slice now
  ~State() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  State(DraOptions o, KubeClient& k, std::vector<Gpu> g, Logger& l, DraHealthView h)
      : opt(std::move(o)), kube(k), gpus(std::move(g)), log(l), health_view(std::move(h)) {}

  std::map<std::string, DraDeviceHealth> health() const {
    return health_view ? health_view() : std::map<std::string, DraDeviceHealth>{};
  }

  std::filesystem::path checkpoint_path() const { return opt.state_dir / kCheckpointFile; }
  std::filesystem::path socket_path() const { return opt.registry_dir / dra_socket_name(opt.id); }

  void wake() {
    std::uint64_t one = 1;
    if (wake_fd >= 0) [[maybe_unused]]
      auto n = ::write(wake_fd, &one, sizeof one);
  }

  // ---- the checkpoint ----
  Status load_checkpoint() {
    auto text = read_file(checkpoint_path());
    if (!text) {
      if (text.error().code == Errc::not_found) return {};
      return std::unexpected(text.error());
    }
    auto claims = dra_parse_checkpoint(*text);
    if (!claims) return std::unexpected(claims.error().wrap(checkpoint_path().string()));
    prepared = std::move(*claims);
    log.info("dra.checkpoint_loaded", {{"claims", std::to_string(prepared.size())}});
    return {};
  }
  // Under mu.
  Status save_checkpoint() {
    return write_file_atomic(checkpoint_path(), dra_checkpoint_text(prepared), Durability::fsync,
                             Symlinks::none, MakeDir::yes);
  }

  // ---- NodePrepareResources, one claim ----
  // A claim prepared before answers as then (the kubelet retries a call that failed for
  // another claim, and replays after its restart): `again`. Else it is read from the API server.
  struct Prepared {
    DraPreparedClaim claim;
    bool again = false;
  };
  Result<Prepared> prepare(const dra::Claim& c) {
    {
      std::lock_guard lock(mu);
      if (auto it = prepared.find(c.uid()); it != prepared.end()) return Prepared{it->second, true};
    }
    auto obj = kube.get(cat("/apis/resource.k8s.io/v1/namespaces/", url_escape(c.namespace_()),
                            "/resourceclaims/", url_escape(c.name())));
    if (!obj) return std::unexpected(obj.error());
    auto claim = dra_claim_devices(*obj, c.uid(), opt.id, gpus);
    if (!claim) return std::unexpected(claim.error());
    std::lock_guard lock(mu);
    if (auto it = prepared.find(c.uid()); it != prepared.end()) return Prepared{it->second, true};
    prepared.emplace(c.uid(), *claim);
    if (auto st = save_checkpoint(); !st) {
      prepared.erase(c.uid());  // not prepared until it is on disk: the kubelet retries
      return std::unexpected(st.error().wrap("checkpoint"));
    }
    return Prepared{std::move(*claim), false};
  }

  Status unprepare(const dra::Claim& c) {
    std::lock_guard lock(mu);
    auto it = prepared.find(c.uid());
    if (it == prepared.end()) return {};  // never prepared, or unprepared already
    auto kept = it->second;
    prepared.erase(it);
    if (auto st = save_checkpoint(); !st) {
      prepared.emplace(c.uid(), std::move(kept));
      return std::unexpected(st.error().wrap("checkpoint"));
    }
    return {};
  }

  // ---- the ResourceSlice ----
  std::optional<std::string> node_uid;
  std::int64_t generation = 1;
  // What we last wrote, and the spec the API server stored for it: the server canonicalises
  // (a quantity "80000000000" comes back "80G") and drops fields a gate of its own turns off
  // (taints before 1.36), so its copy is compared with what it answered last time, never with
  // ours, or the slice would be written again every check.
  std::optional<nlohmann::json> last_want, last_stored;

  static const nlohmann::json& at(const nlohmann::json& j, const char* key) {
    static const nlohmann::json null;
    return j.is_object() && j.contains(key) ? j[key] : null;
  }
  static std::string text_at(const nlohmann::json& j, const char* key) {
    const auto& v = at(j, key);
    return v.is_string() ? v.get<std::string>() : std::string();
  }

  Status ensure_slice() {
    if (!node_uid) {
      auto node = kube.get(cat("/api/v1/nodes/", url_escape(opt.id.node)));
      if (node) {
        auto uid = text_at(at(*node, "metadata"), "uid");
        if (!uid.empty()) node_uid = uid;
      }
    }
    auto want = dra_resource_slice(opt.id, gpus, generation, health());
    if (node_uid) {
      // Deleted with the node, as the kubelet plugin helper's slices are.
      want["metadata"]["ownerReferences"] = {{{"apiVersion", "v1"},
                                              {"kind", "Node"},
                                              {"name", opt.id.node},
                                              {"uid", *node_uid},
                                              {"controller", true}}};
    }
    const std::string base = "/apis/resource.k8s.io/v1/resourceslices";
    const std::string name = dra_slice_name(opt.id);
    auto have = kube.call("GET", cat(base, "/", url_escape(name)));
    if (!have) return std::unexpected(have.error());
    if (have->status == 404) {
      auto made = kube.request("POST", base, dump_json(want));
      if (!made) return std::unexpected(made.error());
      remember(want, *made);
      log.info("dra.slice_published", {{"slice", name},
                                       {"devices", std::to_string(gpus.size())},
                                       {"generation", std::to_string(generation)}});
      return {};
    }
    if (have->status != 200)
      return fail(Errc::rpc, "GET ResourceSlice ", name, ": HTTP ", have->status);
    const auto& spec = at(have->body, "spec");
    // A slice of this name for another node or driver is not ours to overwrite.
    if (text_at(spec, "nodeName") != opt.id.node || text_at(spec, "driver") != opt.id.driver)
      return fail(Errc::conflict, "ResourceSlice ", name, " belongs to node '",
                  text_at(spec, "nodeName"), "', driver '", text_at(spec, "driver"),
                  "': not overwritten");
    auto unchanged = [&] {
      if (last_want && last_stored && dra_same_slice_spec(*last_want, want))
        return dra_same_slice_spec(*last_stored, have->body);
      return dra_same_slice_spec(have->body, want);
    };
    const bool owner_ok = !node_uid || at(at(have->body, "metadata"), "ownerReferences") ==
                                           want["metadata"]["ownerReferences"];
    if (unchanged() && owner_ok) return {};
    const auto& gen = at(at(spec, "pool"), "generation");
    if (gen.is_number_integer()) generation = std::max(generation, gen.get<std::int64_t>() + 1);
    want["spec"]["pool"]["generation"] = generation;
    want["metadata"]["resourceVersion"] = text_at(at(have->body, "metadata"), "resourceVersion");
    auto put = kube.request("PUT", cat(base, "/", url_escape(name)), dump_json(want));
    if (!put) return std::unexpected(put.error());
    remember(want, *put);
    log.info("dra.slice_updated", {{"slice", name}, {"generation", std::to_string(generation)}});
    return {};
  }
  void remember(const nlohmann::json& want, const nlohmann::json& stored) {
    last_want = want;
    last_stored = stored;
  }
  // Never throws: a byte that is no UTF-8 (a GPU name NVML gave) is replaced.
  static std::string dump_json(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  // ---- health: the full list, each device HEALTHY or UNHEALTHY with why ----
  v1alpha1::NodeWatchResourcesResponse health_list() const {
    v1alpha1::NodeWatchResourcesResponse out;
    const auto now = static_cast<std::int64_t>(std::time(nullptr));
    const auto h = health();
    for (const Gpu& g : gpus) {
      auto* d = out.add_devices();
      d->mutable_device()->set_pool_name(opt.id.node);
      d->mutable_device()->set_device_name(dra_device_name(g));
      auto it = h.find(g.uuid);
      const bool healthy = it == h.end() || it->second.healthy;
      d->set_health(healthy ? v1alpha1::HEALTHY : v1alpha1::UNHEALTHY);
      if (!healthy) d->set_message(it->second.reason.substr(0, 1024));
      d->set_last_updated_time(now);
    }
    return out;
  }
};

namespace {

class RegistrationService final : public pluginregistration::Registration::Service {
 public:
  explicit RegistrationService(DraDriver::State& s) : m_s(s) {}
  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    info->set_type("DRAPlugin");
    info->set_name(m_s.opt.id.driver);
    info->set_endpoint(m_s.socket_path().string());
    info->add_supported_versions(std::string(kDraService));
    m_s.wake();  // a kubelet (re)starting: it deleted the node's slices
    return grpc::Status::OK;
  }
  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* status,
                                        pluginregistration::RegistrationStatusResponse*) override {
    if (status->plugin_registered()) {
      m_s.log.info("dra.registered",
                   {{"driver", m_s.opt.id.driver}, {"endpoint", m_s.socket_path().string()}});
    } else {
      m_s.log.error("dra.registration_refused", {{"error", status->error()}});
    }
    m_s.wake();
    return grpc::Status::OK;
  }

 private:
  DraDriver::State& m_s;
};

class DraService final : public dra::DRAPlugin::Service {
 public:
  explicit DraService(DraDriver::State& s) : m_s(s) {}
  grpc::Status NodePrepareResources(grpc::ServerContext*,
                                    const dra::NodePrepareResourcesRequest* req,
                                    dra::NodePrepareResourcesResponse* resp) override {
    for (const auto& c : req->claims()) {
      auto& answer = (*resp->mutable_claims())[c.uid()];
      auto prepared = m_s.prepare(c);
      if (!prepared) {
        answer.set_error(prepared.error().message);
        m_s.log.warn(
            "dra.prepare_failed",
            {{"claim", claim_text(c)}, {"uid", c.uid()}, {"error", prepared.error().message}});
        continue;
      }
      std::vector<std::string> ids;
      for (const auto& d : prepared->claim.devices) {
        auto* dev = answer.add_devices();
        if (!d.request.empty()) dev->add_request_names(d.request);
        dev->set_pool_name(d.pool);
        dev->set_device_name(d.device);
        dev->add_cdi_device_ids(d.cdi_id);
        ids.push_back(d.cdi_id);
      }
      // "again": answered from the checkpoint, nothing read or allocated anew.
      m_s.log.info(prepared->again ? "dra.prepared_again" : "dra.prepared",
                   {{"claim", claim_text(c)}, {"uid", c.uid()}, {"cdi", join(ids, ",")}});
    }
    return grpc::Status::OK;
  }
  grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                      const dra::NodeUnprepareResourcesRequest* req,
                                      dra::NodeUnprepareResourcesResponse* resp) override {
    for (const auto& c : req->claims()) {
      auto& answer = (*resp->mutable_claims())[c.uid()];
      if (auto st = m_s.unprepare(c); !st) {
        answer.set_error(st.error().message);
        m_s.log.warn("dra.unprepare_failed",
                     {{"claim", claim_text(c)}, {"error", st.error().message}});
        continue;
      }
      m_s.log.info("dra.unprepared", {{"claim", claim_text(c)}, {"uid", c.uid()}});
    }
    return grpc::Status::OK;
  }

 private:
  DraDriver::State& m_s;
};

class HealthService final : public v1alpha1::DRAResourceHealth::Service {
 public:
  explicit HealthService(DraDriver::State& s) : m_s(s) {}
  grpc::Status NodeWatchResources(
      grpc::ServerContext* ctx, const v1alpha1::NodeWatchResourcesRequest*,
      grpc::ServerWriter<v1alpha1::NodeWatchResourcesResponse>* writer) override {
    std::uint64_t sent = 0;
    std::unique_lock lock(m_s.mu);
    while (true) {
      auto list = m_s.health_list();
      sent = m_s.health_version;
      lock.unlock();
      if (!writer->Write(list)) return grpc::Status::OK;  // the kubelet went away
      lock.lock();
      // Only a change is sent again; the kubelet going away is seen within a second.
      while (!m_s.cv.wait_for(lock, std::chrono::seconds(1), [&] {
        return m_s.stopping || m_s.health_version != sent || ctx->IsCancelled();
      })) {
      }
      if (m_s.stopping || ctx->IsCancelled()) return grpc::Status::OK;
    }
  }

 private:
  DraDriver::State& m_s;
};

}  // namespace

DraDriver::DraDriver(DraOptions options, KubeClient& kube, std::vector<Gpu> gpus, Logger& log,
                     DraHealthView health)
    : m_state(std::make_unique<State>(std::move(options), kube, std::move(gpus), log,
                                      std::move(health))) {}

DraDriver::~DraDriver() = default;

void DraDriver::health_changed() {
  {
    std::lock_guard lock(m_state->mu);
    ++m_state->health_version;
  }
  m_state->cv.notify_all();
  m_state->wake();
}

std::filesystem::path DraDriver::socket_path() const {
  return m_state->socket_path();
}

Status DraDriver::run(int stop_fd) {
  State& s = *m_state;
  if (auto st = s.load_checkpoint(); !st) return st;
  if (!s.opt.cdi.dir.empty() && !s.gpus.empty()) {
    auto built = build_plugin_cdi_spec(HostFs(s.opt.host_root), s.gpus, s.opt.cdi);
    if (!built) return std::unexpected(built.error().wrap("CDI spec"));
    auto written = write_plugin_cdi_spec(built->spec, s.opt.cdi);
    if (!written) return std::unexpected(written.error().wrap("CDI spec"));
    s.log.info("dra.cdi_spec", {{"path", plugin_cdi_spec_path(s.opt.cdi).string()}});
  }

  std::error_code ec;
  std::filesystem::create_directories(s.opt.registry_dir, ec);
  // A socket left by a crash (nothing answers on it); a live one is another instance's (a rolling
  // update's surge), and anything else there is not ours to remove.
  struct stat st {};
  if (::lstat(s.socket_path().c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode) || socket_answers(s.socket_path()))
      return fail(Errc::conflict, s.socket_path().string(),
                  S_ISSOCK(st.st_mode) ? " is served by another process"
                                       : " exists and is no socket");
    std::filesystem::remove(s.socket_path(), ec);
  }
  RegistrationService reg(s);
  DraService dra_service(s);
  HealthService health(s);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + s.socket_path().string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&reg);
  builder.RegisterService(&dra_service);
  builder.RegisterService(&health);
  auto server = builder.BuildAndStart();
  if (!server) return fail(Errc::rpc, "cannot serve on ", s.socket_path().string());
  struct stat ours {};
  ::lstat(s.socket_path().c_str(), &ours);
  s.log.info("dra.serving", {{"socket", s.socket_path().string()},
                             {"driver", s.opt.id.driver},
                             {"node", s.opt.id.node},
                             {"devices", std::to_string(s.gpus.size())}});

  std::string last_error;
  // After a wake (a kubelet registering us: it deletes the node's slices as it starts, perhaps
  // just after), look again a second later too.
  int next_ms = static_cast<int>(s.opt.slice_check.count());
  while (true) {
    Status st2;
    try {
      st2 = s.ensure_slice();
    } catch (const std::exception& e) {  // an API answer of a shape nobody expected
      st2 = fail(Errc::internal, "ResourceSlice: ", e.what());
    }
    if (!st2) {
      if (st2.error().message != last_error)
        s.log.warn("dra.slice_failed", {{"error", st2.error().message}});
      last_error = st2.error().message;
    } else {
      last_error.clear();
    }
    pollfd fds[2] = {{stop_fd, POLLIN, 0}, {s.wake_fd, POLLIN, 0}};
    if (::poll(fds, 2, next_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents) break;
    next_ms = static_cast<int>(s.opt.slice_check.count());
    if (fds[1].revents & POLLIN) {
      std::uint64_t n;
      [[maybe_unused]] auto r = ::read(s.wake_fd, &n, sizeof n);
      next_ms = std::min(next_ms, 1000);
    }
  }
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server.reset();
  // Only our own: a successor may have made its socket there meanwhile.
  struct stat now {};
  if (::lstat(s.socket_path().c_str(), &now) == 0 && now.st_dev == ours.st_dev &&
      now.st_ino == ours.st_ino)
    std::filesystem::remove(s.socket_path(), ec);
  s.log.info("dra.stopped", {{"socket", s.socket_path().string()}});
  return {};
}

}  // namespace gpufence
