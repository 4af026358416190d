#include "deviceplugin/health_monitor.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>

namespace gpufence {

namespace {

using namespace std::chrono_literals;

// How long one nvmlEventSetWait_v2 waits: short, so a stop is noticed without help and health
// changes reach the kubelet well within a second.
constexpr auto kEventWait = 200ms;
// Without a usable event stream, how often every GPU is asked whether it answers.
constexpr auto kPollWithoutEvents = 500ms;
// How often a GPU whose recovery action is not none is asked again.
constexpr auto kActionPoll = 1s;

}  // namespace

// Calls handed to the watchdog capture the inventory and values, never the monitor: a call
// abandoned on a hang may outlive it.
struct HealthMonitor::Impl {
  GpuInventory& inventory;
  NvmlWatchdog& watchdog;
  std::vector<MonitoredGpu> gpus;
  HealthOptions options;
  Logger& log;
  OnChange on_change;

  mutable std::mutex mu;  // guards the tracker only; never held across NVML
  HealthTracker tracker;
  int stop_fd = -1;  // an eventfd: readable once stop() is called
  std::atomic<bool> stopping{false};
  bool events_broken = false;
  // The last event was a GPU lost with no UUID (the wait itself answered GPU_IS_LOST): the
  // driver answers every wait so at once while the GPU stays lost.
  bool lost_wait = false;
  bool failures_reported = false;
  // Recovery actions: asked of every GPU in the first round, then after each XID of a GPU and
  // each kActionPoll while one is not none; never again of a GPU whose driver has none.
  bool actions_asked = false;
  std::set<std::string> no_action_field;
  std::chrono::steady_clock::time_point last_action_poll{};

  Impl(GpuInventory& i, NvmlWatchdog& w, std::vector<MonitoredGpu> g, HealthOptions o, Logger& l,
       OnChange c)
      : inventory(i),
        watchdog(w),
        gpus(std::move(g)),
        options(o),
        log(l),
        on_change(std::move(c)),
        tracker(uuids_of(gpus), std::move(o)) {}

  static std::vector<std::string> uuids_of(const std::vector<MonitoredGpu>& gpus) {
    std::vector<std::string> out;
    for (const auto& g : gpus) out.push_back(g.uuid);
    return out;
  }

  // Sleeps up to `d`; false once stopping.
  bool pause(std::chrono::milliseconds d) {
    pollfd fd{stop_fd, POLLIN, 0};
    ::poll(&fd, 1, static_cast<int>(d.count()));
    return !stopping;
  }

  // Steps of one round, in order.
  Result<std::optional<GpuEvent>> next_event();
  void report_registration_failures();
  std::map<std::string, Status> ask_liveness(const std::optional<GpuEvent>& event);
  std::map<std::string, GpuRecoveryAction> ask_recovery_actions(
      const std::optional<GpuEvent>& event);
  bool apply(const std::optional<GpuEvent>& event, const std::map<std::string, Status>& answers,
             const std::map<std::string, GpuRecoveryAction>& actions);
  void log_health();
};

Result<std::optional<GpuEvent>> HealthMonitor::Impl::next_event() {
  // The event wait's own timeout plus the watchdog's deadline: only a wait that overstays both
  // counts as hung.
  return watchdog.call<Result<std::optional<GpuEvent>>>(
      "nvmlEventSetWait_v2", [&inv = inventory] { return inv.wait_event(kEventWait); }, stop_fd,
      watchdog.deadline() + kEventWait);
}

void HealthMonitor::Impl::report_registration_failures() {
  auto failures = watchdog.call<Result<std::vector<EventRegistrationFailure>>>(
      "event registration failures",
      [&inv = inventory]() -> Result<std::vector<EventRegistrationFailure>> {
        return inv.event_registration_failures();
      },
      stop_fd);
  if (!failures) return;  // asked again next round
  failures_reported = true;
  for (const auto& f : *failures) {
    log.warn("plugin.gpu_events_unregistered",
             {{"uuid", f.uuid}, {"error", f.error}, {"effect", "its XIDs go unseen"}});
  }
  // From here on an XID of a registered GPU reaches the monitor (NVML delivers no event that
  // came before the registration).
  log.info("plugin.health_events_registered",
           {{"gpus", std::to_string(gpus.size() - std::min(gpus.size(), failures->size()))},
            {"unregistered", std::to_string(failures->size())}});
}

std::map<std::string, Status> HealthMonitor::Impl::ask_liveness(
    const std::optional<GpuEvent>& event) {
  std::vector<std::string> ask;
  {
    std::lock_guard lock(mu);
    ask = event && event->gpu_lost ? tracker.uuids() : tracker.lost();
  }
  std::map<std::string, Status> answers;
  for (const auto& uuid : ask) {
    if (stopping) break;
    answers[uuid] = watchdog.call<Status>(
        "nvmlDeviceGetUUID " + uuid, [&inv = inventory, uuid] { return inv.check_alive(uuid); },
        stop_fd);
  }
  return answers;
}

std::map<std::string, GpuRecoveryAction> HealthMonitor::Impl::ask_recovery_actions(
    const std::optional<GpuEvent>& event) {
  auto now = std::chrono::steady_clock::now();
  std::set<std::string> ask;
  {
    std::lock_guard lock(mu);
    if (!actions_asked) {
      for (const auto& u : tracker.uuids()) ask.insert(u);
    } else if (event && !event->gpu_lost && event->xid &&
               (event->xid == kRecoveryActionChangedXid ||
                !options.ignored_xids.contains(event->xid))) {
      if (event->uuid.empty())
        for (const auto& u : tracker.uuids()) ask.insert(u);
      else
        ask.insert(event->uuid);
    }
    if (now - last_action_poll >= kActionPoll) {
      for (const auto& u : tracker.awaiting_action()) ask.insert(u);
      last_action_poll = now;
    }
  }
  actions_asked = true;
  std::map<std::string, GpuRecoveryAction> answers;
  for (const auto& uuid : ask) {
    if (stopping) break;
    if (no_action_field.contains(uuid)) continue;
    auto action = watchdog.call<Result<GpuRecoveryAction>>(
        "nvmlDeviceGetFieldValues " + uuid,
        [&inv = inventory, uuid] { return inv.recovery_action(uuid); }, stop_fd);
    if (action) {
      answers[uuid] = *action;
    } else if (action.error().code == Errc::unsupported) {
      no_action_field.insert(uuid);
      log.debug("plugin.recovery_action_unsupported",
                {{"uuid", uuid}, {"error", action.error().message}});
    }
  }
  return answers;
}

bool HealthMonitor::Impl::apply(const std::optional<GpuEvent>& event,
                                const std::map<std::string, Status>& answers,
                                const std::map<std::string, GpuRecoveryAction>& actions) {
  auto alive = [&](const std::string& uuid) -> Status {
    auto it = answers.find(uuid);
    return it == answers.end() ? Status{} : it->second;
  };
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu);
  bool changed = event ? tracker.on_event(*event, now, alive) : false;
  for (const auto& [uuid, action] : actions) {
    changed |= tracker.on_recovery_action(uuid, action, now);
  }
  changed |= tracker.on_tick(now, alive);
  return changed;
}

void HealthMonitor::Impl::log_health() {
  std::lock_guard lock(mu);
  for (const auto& g : gpus) {
    log.info("plugin.health", {{"id", g.id},
                               {"uuid", g.uuid},
                               {"health", tracker.healthy(g.uuid) ? "Healthy" : "Unhealthy"},
                               {"reason", tracker.reason(g.uuid)}});
  }
}

HealthMonitor::HealthMonitor(GpuInventory& inventory, NvmlWatchdog& watchdog,
                             const std::vector<MonitoredGpu>& gpus, HealthOptions options,
                             Logger& log, OnChange on_change)
    : m(std::make_unique<Impl>(inventory, watchdog, gpus, std::move(options), log,
                               std::move(on_change))) {
  m->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

HealthMonitor::~HealthMonitor() {
  stop();
  if (m->stop_fd >= 0) ::close(m->stop_fd);
}

Status HealthMonitor::start() {
  if (m->stop_fd < 0) return fail_errno("eventfd for", "the health monitor");
  m->stopping = false;
  m_thread = std::thread([this] {
    while (!m->stopping) step();
  });
  return {};
}

void HealthMonitor::stop() {
  m->stopping = true;
  std::uint64_t one = 1;
  if (m->stop_fd >= 0) [[maybe_unused]]
    auto n = ::write(m->stop_fd, &one, sizeof one);
  if (m_thread.joinable()) m_thread.join();
}

bool HealthMonitor::step() {
  Impl& s = *m;
  if (!s.options.enabled) {
    s.pause(kPollWithoutEvents);
    return false;
  }
  std::optional<GpuEvent> event;
  auto next = s.next_event();
  if (s.stopping) return false;
  if (!next) {
    // No usable event stream (no event API, an error, or a hung wait): still notice GPUs that
    // stop answering, by asking each one.
    if (!s.events_broken) {
      s.log.warn("plugin.health_events_unavailable",
                 {{"error", next.error().message}, {"fallback", "ask every GPU each 500ms"}});
    }
    s.events_broken = true;
    event = GpuEvent{"", 0, true};
  } else {
    if (s.events_broken) s.log.info("plugin.health_events_available");
    s.events_broken = false;
    if (!s.failures_reported) s.report_registration_failures();
    if (next->has_value()) {
      event = **next;
      const GpuEvent& ev = *event;
      const bool lost_wait = ev.gpu_lost && ev.uuid.empty();
      // Logged once while it repeats (a lost GPU answers every wait at once).
      if (!(lost_wait && s.lost_wait))
        s.log.info("plugin.gpu_event",
                   {{"uuid", ev.uuid},
                    {"xid", std::to_string(ev.xid)},
                    {"lost", ev.gpu_lost ? "true" : "false"},
                    {"ignored",
                     s.options.ignored_xids.contains(ev.xid) && !ev.gpu_lost ? "true" : "false"}});
      s.lost_wait = lost_wait;
    } else {
      s.lost_wait = false;
    }
  }
  auto answers = s.ask_liveness(event);
  auto actions = s.ask_recovery_actions(event);
  // A stop cuts liveness calls short; their "stopped" answers say nothing about the GPUs.
  if (s.stopping) return false;
  bool changed = s.apply(event, answers, actions);
  if (changed) {
    s.log_health();
    if (s.on_change) s.on_change();
  }
  // No busy loop on a wait that returns at once: a broken event stream, or a lost GPU.
  if (s.events_broken || s.lost_wait) s.pause(kPollWithoutEvents);
  return changed;
}

bool HealthMonitor::healthy(const std::string& uuid) const {
  std::lock_guard lock(m->mu);
  return m->tracker.healthy(uuid);
}

std::vector<GpuHealthReport> HealthMonitor::report() const {
  std::lock_guard lock(m->mu);
  return m->tracker.report();
}

std::vector<HealthTransition> HealthMonitor::take_transitions() {
  std::lock_guard lock(m->mu);
  return m->tracker.take_transitions();
}

std::string HealthMonitor::reason(const std::string& uuid) const {
  std::lock_guard lock(m->mu);
  return m->tracker.reason(uuid);
}

}  // namespace gpufence
