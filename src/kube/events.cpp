#include "kube/events.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "common/utc_time.hpp"

namespace gpufence {

namespace {

constexpr size_t kMaxSubdomain = 253;  // IsDNS1123Subdomain's DNS1123SubdomainMaxLength

bool lower_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

// `name` made a DNS-1123 subdomain of at most `max` characters ("" when nothing is left): labels
// of [a-z0-9-] that start and end alphanumeric, joined by single dots.
std::string subdomain_prefix(std::string_view name, size_t max) {
  std::string out, label;
  auto end_label = [&] {
    auto first = label.find_first_not_of('-');
    if (first != std::string::npos) {
      auto last = label.find_last_not_of('-');
      if (!out.empty()) out += '.';
      out += label.substr(first, last - first + 1);
    }
    label.clear();
  };
  for (char c : name) {
    char l = c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    if (l == '.') {
      end_label();
    } else {
      label += lower_alnum(l) ? l : '-';
    }
  }
  end_label();
  if (out.size() > max) out.resize(max);
  while (!out.empty() && !lower_alnum(out.back())) out.pop_back();  // a cut label's '-' or '.'
  return out;
}

}  // namespace

std::string event_name(std::string_view object_name, std::chrono::system_clock::time_point t) {
  auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  char hex[17];
  auto end = std::to_chars(hex, hex + sizeof hex, static_cast<std::uint64_t>(nanos), 16).ptr;
  std::string suffix(hex, end);
  std::string prefix = subdomain_prefix(object_name, kMaxSubdomain - 1 - suffix.size());
  return (prefix.empty() ? std::string("gpufence") : prefix) + "." + suffix;
}

std::string micro_time(std::chrono::system_clock::time_point t) {
  return utc_rfc3339(t, SubSecond::micros);
}

std::string event_namespace(const EventRegarding& regarding) {
  return regarding.ns.empty() ? std::string("default") : regarding.ns;
}

nlohmann::json event_object(const EventRegarding& regarding, const EventSource& source,
                            const KubeEvent& event, std::chrono::system_clock::time_point t) {
  // The API refuses a note over 1 kB: cut on a UTF-8 character's boundary, so the JSON writer's
  // replacement of a cut character cannot make it longer again.
  std::string note = event.note;
  if (note.size() > 1024) {
    size_t cut = 1021;
    while (cut > 0 && (static_cast<unsigned char>(note[cut]) & 0xC0) == 0x80) --cut;
    note = note.substr(0, cut) + "...";
  }
  nlohmann::json about{
      {"apiVersion", regarding.api_version}, {"kind", regarding.kind}, {"name", regarding.name}};
  if (!regarding.ns.empty()) about["namespace"] = regarding.ns;
  if (!regarding.uid.empty()) about["uid"] = regarding.uid;
  return {{"apiVersion", "events.k8s.io/v1"},
          {"kind", "Event"},
          {"metadata",
           {{"name", event_name(regarding.name, t)}, {"namespace", event_namespace(regarding)}}},
          {"eventTime", micro_time(t)},
          {"reportingController", source.controller},
          {"reportingInstance", source.instance.substr(0, 128)},
          {"action", event.action.substr(0, 128)},
          {"reason", event.reason.substr(0, 128)},
          {"note", note},
          {"type", event.type},
          {"regarding", about}};
}

Status post_event(KubeClient& kube, const EventRegarding& regarding, const EventSource& source,
                  const KubeEvent& event) {
  const std::string path =
      "/apis/events.k8s.io/v1/namespaces/" + event_namespace(regarding) + "/events";
  // A note may quote bytes that are not UTF-8 (a path, a pod's value): replaced, never a throw.
  auto body = [&](std::chrono::system_clock::time_point at) {
    return event_object(regarding, source, event, at)
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  auto t = std::chrono::system_clock::now();
  auto answer = kube.request("POST", path, body(t));
  if (!answer && answer.error().code == Errc::conflict) {
    // The name is taken (another Event in the same nanosecond): once more, with a later time.
    t = std::max(std::chrono::system_clock::now(), t + std::chrono::nanoseconds(1));
    answer = kube.request("POST", path, body(t));
  }
  if (!answer) return std::unexpected(answer.error().wrap("record event"));
  return {};
}

EventQueue::EventQueue(KubeClient& kube, EventSource source, Logger& log, size_t capacity)
    : EventQueue(
          [&kube, source = std::move(source)](const EventRegarding& r, const KubeEvent& e) {
            return post_event(kube, r, source, e);
          },
          log, capacity) {}

EventQueue::EventQueue(Post post, Logger& log, size_t capacity)
    : m_post(std::move(post)), m_log(log), m_capacity(capacity) {
  m_thread = std::thread([this] { serve(); });
}

EventQueue::~EventQueue() {
  {
    std::lock_guard lock(m_mu);
    m_stopping = true;
  }
  m_cv.notify_all();
  m_thread.join();
}

void EventQueue::post(EventRegarding regarding, KubeEvent event) {
  {
    std::lock_guard lock(m_mu);
    if (m_stopping) return;
    if (m_waiting.size() >= m_capacity) {
      m_waiting.pop_front();
      ++m_dropped;
    }
    m_waiting.emplace_back(std::move(regarding), std::move(event));
  }
  m_cv.notify_all();
}

void EventQueue::drain() {
  std::unique_lock lock(m_mu);
  m_cv.wait(lock, [&] { return (m_waiting.empty() && !m_busy) || m_stopping; });
}

void EventQueue::serve() {
  std::unique_lock lock(m_mu);
  while (true) {
    m_cv.wait(lock, [&] { return m_stopping || !m_waiting.empty(); });
    if (m_stopping) return;
    auto [regarding, event] = std::move(m_waiting.front());
    m_waiting.pop_front();
    m_busy = true;
    lock.unlock();
    auto st = m_post(regarding, event);
    if (!st) {
      ++m_failed;
      m_log.warn("event.failed", {{"reason", event.reason}, {"error", st.error().message}});
    }
    lock.lock();
    m_busy = false;
    m_cv.notify_all();
  }
}

}  // namespace gpufence
