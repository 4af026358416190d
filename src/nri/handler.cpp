#include "nri/handler.hpp"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>
#include "common/escape.hpp"
#include "common/file.hpp"
#include "common/strings.hpp"
#include "gpu/wire_contract.hpp"
#include "runtime/device_rules.hpp"

namespace gpufence::nri {

Status GpufenceHandler::configured(const RuntimeInfo& runtime) {
  if (!runtime.config.empty()) {
    auto config = parse_runtime_config(runtime.config, "the NRI plugin config");
    if (!config) {
      m_ctx.log.error("nri.bad_config", {{"error", config.error().message}});
      return std::unexpected(config.error());
    }
    if (inventory_for && config->nvml_library != m_ctx.config.nvml_library)
      m_ctx.open_inventory = inventory_for(config->nvml_library);
    m_ctx.config = *config;
    if (!m_ctx.config.log_file.empty()) {
      if (auto st = m_ctx.log.open_file(m_ctx.config.log_file); !st)
        m_ctx.log.warn("nri.log_file_unavailable", {{"error", st.error().message}});
    }
  }
  m_runtime = runtime;
  m_ctx.log.info("nri.configured",
                 {{"runtime", runtime.name},
                  {"version", runtime.version},
                  {"nri", runtime.nri_text()},
                  {"device_rules", runtime.device_rules ? "applied" : "ignored-by-runtime"}});
  if (!runtime.device_rules)
    m_ctx.log.warn("nri.privileged_gap",
                   {{"why",
                     "NRI below v0.10 applies no device cgroup rules: a privileged "
                     "container keeps every device; pair gpufence-nri with the "
                     "gpufence-runtime handler for privileged GPU pods"}});
  return {};
}

namespace {
void write_status(const std::string& path, const NriStatus& status, Logger& log);
}  // namespace

// The status file's state, shared with the judging threads (which may outlive a session).
struct GpufenceHandler::StatusState {
  std::mutex mutex;
  std::condition_variable judged;
  NriStatus status;
  uint64_t session = 0;         // bumped by every Synchronize and every disconnection
  uint64_t judged_session = 0;  // the session whose judgement the file holds
  // One judging thread at a time; a newer Synchronize replaces one still waiting (the older
  // list is out of date), never one running (its result is kept, marked stale).
  std::function<void()> pending;
  bool running = false;
  int judging = 0;                   // Synchronizes whose judgement is not in the file yet
  bool decisions_unwritten = false;  // counted since the file was last written
  std::string path;                  // the status file, as the last connection's config names it
  // Held by whoever writes the file, taken before `mutex`: writers in order, newest last.
  std::mutex write_mutex;
};

namespace {
// How often counted decisions reach the status file: never on a request's path.
constexpr auto kCountersFlush = std::chrono::seconds(5);
}  // namespace

GpufenceHandler::GpufenceHandler(ShimContext& ctx, std::string socket)
    : m_ctx(ctx), m_hung(std::make_shared<Hung>()), m_status(std::make_shared<StatusState>()) {
  m_status->status.pid = ::getpid();
  if (auto text = read_file("/proc/self/stat"))
    if (auto t = parse_proc_start_time(*text)) m_status->status.start_time = *t;
  m_status->status.socket = std::move(socket);
  m_status->status.since = utc_now_text();
  // The file is written with `mutex` released (a CreateContainer counting its decision never
  // waits for the disk), under `write_mutex`, which orders the writers so the newest copy is
  // written last.
  m_flusher = std::jthread([state = m_status, &log = m_ctx.log](std::stop_token stop) {
    std::condition_variable_any wake;
    std::mutex sleep;
    std::unique_lock asleep(sleep);
    while (!stop.stop_requested()) {
      wake.wait_for(asleep, stop, kCountersFlush, [] { return false; });
      if (stop.stop_requested()) break;
      std::lock_guard writing(state->write_mutex);
      NriStatus copy;
      std::string path;
      {
        std::lock_guard lock(state->mutex);
        if (!state->decisions_unwritten) continue;
        state->decisions_unwritten = false;
        copy = state->status;
        path = state->path;
      }
      write_status(path, copy, log);
    }
  });
}

namespace {
void write_status(const std::string& path, const NriStatus& status, Logger& log) {
  if (path.empty()) return;
  if (auto w = write_nri_status(path, status); !w)
    log.warn("nri.status_unwritten", {{"file", path}, {"error", w.error().message}});
}
}  // namespace

void GpufenceHandler::disconnected(NriState state) {
  // A split Synchronize broken off before its last chunk is forgotten: no ghost of it in the
  // next connection's list.
  m_sync_pods.clear();
  m_sync_containers.clear();
  std::lock_guard writing(m_status->write_mutex);
  NriStatus copy;
  {
    std::lock_guard lock(m_status->mutex);
    ++m_status->session;
    m_status->status.state = state;
    m_status->status.since = utc_now_text();
    if (m_status->judged_session != 0) m_status->status.judgement_stale = true;
    m_status->path = m_ctx.config.nri_status_file;
    m_status->decisions_unwritten = false;
    copy = m_status->status;
  }
  write_status(m_status->path, copy, m_ctx.log);
}

void GpufenceHandler::wait_for_judgement() {
  std::unique_lock lock(m_status->mutex);
  m_status->judged.wait(lock, [&] { return m_status->judging == 0; });
}

std::chrono::milliseconds GpufenceHandler::decision_budget() const {
  return std::chrono::milliseconds(std::max<int64_t>(m_runtime.request_timeout_ms * 3 / 4, 100));
}

void GpufenceHandler::synchronized(const api::SynchronizeRequest& request) {
  m_ctx.log.info("nri.synchronized", {{"pods", std::to_string(request.pods_size())},
                                      {"containers", std::to_string(request.containers_size())},
                                      {"more", request.more() ? "true" : "false"}});
  m_sync_pods.insert(m_sync_pods.end(), request.pods().begin(), request.pods().end());
  m_sync_containers.insert(m_sync_containers.end(), request.containers().begin(),
                           request.containers().end());
  if (request.more()) return;

  // Connected: said at once; what the containers show, once judged off the runtime's clock.
  std::unique_lock writing(m_status->write_mutex);
  std::unique_lock lock(m_status->mutex);
  const uint64_t session = ++m_status->session;
  NriStatus& s = m_status->status;
  s.state = NriState::connected;
  s.since = utc_now_text();
  s.runtime = m_runtime.name;
  s.runtime_version = m_runtime.version;
  s.nri_version = m_runtime.nri_text();
  s.device_rules = m_runtime.device_rules;
  if (m_status->judged_session != 0) s.judgement_stale = true;
  m_status->path = m_ctx.config.nri_status_file;
  m_status->decisions_unwritten = false;
  write_status(m_status->path, s, m_ctx.log);
  if (!m_status->pending) ++m_status->judging;  // a replaced pending one was counted already
  m_status->pending = [state = m_status, session, path = m_ctx.config.nri_status_file,
                       pods = std::move(m_sync_pods), containers = std::move(m_sync_containers),
                       runtime = m_runtime, budget = decision_budget(),
                       ctx = std::make_shared<ShimContext>(m_ctx)]() {
    auto judgement = judge_synchronized(pods, containers, runtime, *ctx, budget);
    for (const auto& u : judgement.unenforced)
      ctx->log.warn("nri.unenforced", {{"container", u.id},
                                       {"pod", u.pod},
                                       {"name", u.name},
                                       {"handler", u.runtime_handler},
                                       {"why", u.why}});
    std::lock_guard writing(state->write_mutex);
    std::optional<NriStatus> copy;
    {
      std::lock_guard lock(state->mutex);
      // Kept even when a reconnection came meanwhile (then marked stale): reconnecting often
      // must not keep the list empty.
      if (session >= state->judged_session) {
        NriStatus& st = state->status;
        state->judged_session = session;
        st.synchronized_at = utc_now_text();
        st.containers = judgement.containers;
        st.without_gpu_edit = judgement.without_gpu_edit;
        st.unenforced = std::move(judgement.unenforced);
        st.judgement_stale = state->session != session;
        copy = st;
      }
    }
    if (copy) write_status(path, *copy, ctx->log);
  };
  m_sync_pods.clear();
  m_sync_containers.clear();
  if (m_status->running) return;  // the running thread takes it next
  m_status->running = true;
  lock.unlock();
  writing.unlock();
  try {
    std::thread([state = m_status] {
      std::unique_lock lock(state->mutex);
      while (state->pending) {
        auto job = std::move(state->pending);
        state->pending = nullptr;
        lock.unlock();
        try {
          job();
        } catch (const std::exception& e) {
          // The list stays as it was (marked stale by the next Synchronize); the process lives.
          std::fprintf(stderr, "gpufence-nri: judging failed: %s\n", e.what());
        }
        lock.lock();
        --state->judging;
        state->judged.notify_all();
      }
      state->running = false;
    }).detach();
  } catch (const std::system_error& e) {
    m_ctx.log.error("nri.unjudged", {{"error", e.what()}});
    std::lock_guard relock(m_status->mutex);
    m_status->pending = nullptr;
    m_status->running = false;
    --m_status->judging;
    m_status->judged.notify_all();
  }
}

// At most this many decisions left hanging at once; past it every creation is refused at once
// rather than starting one more thread that would hang too (each holds its copies). A pod with a
// decision still hung is refused at once on its own (its volume is the likely cause: an NFS
// server that stopped answering), so one pod cannot use up the node's share.
inline constexpr size_t kMaxHungDecisions = 16;

struct GpufenceHandler::Hung {
  std::mutex mutex;
  std::multiset<std::string> pods;  // by pod uid (namespace/name when it has none)
  void add(const std::string& pod) {
    std::lock_guard lock(mutex);
    pods.insert(pod);
  }
  void release(const std::string& pod) {
    std::lock_guard lock(mutex);
    if (auto it = pods.find(pod); it != pods.end()) pods.erase(it);
  }
  // Why a new decision for `pod` is refused at once, or "".
  std::string refusal(const std::string& pod) {
    std::lock_guard lock(mutex);
    if (pods.contains(pod)) return "an earlier decision for this pod is still hung";
    if (pods.size() >= kMaxHungDecisions)
      return cat(pods.size(), " earlier decisions are still hung");
    return "";
  }
};

// A runtime that times out on a plugin (plugin_request_timeout, 2 s by default) drops it and
// creates the container as if it had answered nothing, and required_plugins still counts it as
// present for that call (docs/nri.md): a hung decision (NVML, a stuck filesystem) would let the
// container through unadjusted. So decisions run on a worker thread with a budget of 3/4 of the
// runtime's timeout, and a decision that does not come in time is a refusal.
// One worker thread takes the decisions in turn; it is abandoned (and a new one started for the
// next call) only when a decision overruns its budget.
struct GpufenceHandler::Worker {
  struct Job {
    std::function<Result<NriDecision>()> decide;
    Result<NriDecision> result = fail(Errc::internal, "no decision");
    bool done = false;
  };
  std::mutex mutex;
  std::condition_variable wake, done;
  std::shared_ptr<Job> job;  // the one pending or running
  bool abandoned = false;
  // Decisions abandoned and not returned yet (a hung NVML call or filesystem), shared by every
  // worker of one handler; this worker's pod once it is abandoned.
  std::shared_ptr<Hung> hung;
  std::string hung_pod;

  static void run(std::shared_ptr<Worker> self) {
    std::unique_lock lock(self->mutex);
    for (;;) {
      self->wake.wait(lock, [&] { return self->abandoned || (self->job && !self->job->done); });
      if (self->abandoned) return;
      auto job = self->job;
      lock.unlock();
      // A throw here would end the process every container waits on: it is this decision's
      // refusal instead (closed: the creation fails).
      Result<NriDecision> result = fail(Errc::internal, "no decision");
      try {
        result = job->decide();
      } catch (const std::exception& e) {
        result = fail(Errc::internal, "the decision failed: ", e.what());
      }
      lock.lock();
      job->result = std::move(result);
      job->done = true;
      self->done.notify_all();
      if (self->abandoned) {
        self->hung->release(self->hung_pod);
        return;
      }
    }
  }
};

GpufenceHandler::~GpufenceHandler() {
  m_flusher.request_stop();
  if (m_flusher.joinable()) m_flusher.join();
  if (!m_worker) return;
  std::lock_guard lock(m_worker->mutex);
  m_worker->abandoned = true;
  m_worker->wake.notify_all();
}

Result<NriDecision> GpufenceHandler::decide_within_budget(const api::PodSandbox& pod,
                                                          const api::Container& container,
                                                          SteadyTime received) {
  const std::string who = cat("container ", escape_excerpt(container.name()), " of pod ",
                              escape_excerpt(pod.namespace_()), "/", escape_excerpt(pod.name()));
  // The budget counts from the request's arrival: the runtime's clock started before ours.
  const auto budget =
      std::chrono::milliseconds(std::max<int64_t>(m_runtime.request_timeout_ms * 3 / 4, 100));
  const SteadyTime deadline = received + budget;
  // Bounded before the copies below are made.
  if (auto st = check_request_limits(pod, container); !st)
    return std::unexpected(st.error().wrap(who));
  const std::string pod_key =
      pod.uid().empty() ? cat(pod.namespace_(), "/", pod.name()) : pod.uid();
  if (std::string why = m_hung->refusal(pod_key); !why.empty())
    return fail(Errc::denied, who, ": ", why,
                " (NVML or a filesystem does not answer); "
                "refused at once");
  if (!m_worker) {
    m_worker = std::make_shared<Worker>();
    m_worker->hung = m_hung;
    try {
      std::thread(Worker::run, m_worker).detach();
    } catch (const std::system_error& e) {
      m_worker.reset();
      return fail(Errc::internal, "cannot start the decision thread: ", e.what());
    }
  }
  auto job = std::make_shared<Worker::Job>();
  // The job owns copies of what it reads (the Logger is thread-safe): one left hanging shares
  // nothing mutable with later calls.
  job->decide = [pod, container, runtime = m_runtime, deadline,
                 ctx = std::make_shared<ShimContext>(m_ctx)]() {
    return decide_container(pod, container, runtime, *ctx, deadline);
  };
  std::unique_lock lock(m_worker->mutex);
  m_worker->job = job;
  m_worker->wake.notify_one();
  if (!m_worker->done.wait_until(lock, deadline, [&] { return job->done; })) {
    m_worker->abandoned = true;  // it stops at its next step, or once its call returns
    m_worker->hung_pod = pod_key;
    m_hung->add(pod_key);
    lock.unlock();
    m_worker.reset();
    return fail(Errc::denied, who, ": no decision within ", budget.count(),
                " ms of the request (the runtime would create it unadjusted after its request "
                "timeout)");
  }
  return std::move(job->result);
}

void GpufenceHandler::count_decision(const Result<NriDecision>& decision, double seconds) {
  std::string_view outcome = "no_gpu", refusal;
  if (!decision) {
    outcome = "refused";
    refusal = decision.error().code == Errc::denied             ? "denied"
              : decision.error().code == Errc::invalid_argument ? "invalid"
                                                                : "error";
  } else if (decision->node_agent) {
    outcome = "node_agent";
  } else if (!decision->shim.granted.empty()) {
    outcome = "granted";
  }
  std::lock_guard lock(m_status->mutex);
  m_status->status.decisions.observe(outcome, refusal, seconds);
  m_status->decisions_unwritten = true;
}

Result<api::ContainerAdjustment> GpufenceHandler::create_container(const api::PodSandbox& pod,
                                                                   const api::Container& container,
                                                                   SteadyTime received) {
  const auto start = std::chrono::steady_clock::now();
  auto decision = decide_within_budget(pod, container, received);
  const auto took = std::chrono::steady_clock::now() - start;
  const auto took_us = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
  count_decision(decision, std::chrono::duration<double>(took).count());
  if (!decision) {
    m_ctx.log.error("nri.refused", {{"container", container.id()},
                                    {"pod", cat(pod.namespace_(), "/", pod.name())},
                                    {"name", container.name()},
                                    {"error", decision.error().message}});
    return std::unexpected(
        Error{decision.error().code, "gpufence-nri: " + decision.error().message});
  }
  const ShimDecision& d = decision->shim;
  if (decision->node_agent) {
    m_ctx.log.info("nri.node_agent", {{"container", container.id()},
                                      {"pod", cat(pod.namespace_(), "/", pod.name())},
                                      {"name", container.name()},
                                      {"why", "its namespace is in [nri] node_agent_namespaces"}});
    return std::move(decision->adjust);
  }
  if (!d.ignored.empty())
    m_ctx.log.info("nri.ignored", {{"container", d.container_id}, {"what", join(d.ignored, "; ")}});
  m_ctx.log.info("nri.decision", {{"container", d.container_id},
                                  {"pod", cat(pod.namespace_(), "/", pod.name())},
                                  {"name", container.name()},
                                  {"channel", std::string(channel_name(d.channel))},
                                  {"privileged", d.admits_all_devices ? "true" : "false"},
                                  {"passthrough", d.passthrough ? "true" : "false"},
                                  {"granted", join(d.granted, ",")},
                                  {"removed", join(d.removed_nodes, ",")},
                                  {"whitelist", d.whitelisted ? "true" : "false"},
                                  {"rules", decision->rules},
                                  {"adjusted", decision->edited ? "true" : "false"},
                                  {"gpus_from", d.inventory_source},
                                  {"nodes", join(d.granted_nodes, ",")},
                                  {"gaps", join(decision->gaps, "; ")},
                                  {"took_us", std::to_string(took_us)}});
  if (m_ctx.log.enabled(LogLevel::debug))
    m_ctx.log.debug("nri.adjustment", {{"container", d.container_id},
                                       {"adjust", decision->adjust.ShortDebugString()}});
  return std::move(decision->adjust);
}

}  // namespace gpufence::nri
