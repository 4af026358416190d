// Kubernetes Events (events.k8s.io/v1), so `kubectl describe` and `kubectl events` show what
// gpufence did and saw: the autoscaler's decisions on a Deployment, a GPU's health transitions
// and the doctor's findings on a Node or a Pod. An Event is POSTed into the namespace of the
// object it is about ("default" for a cluster-scoped one such as a Node, as the kubelet does).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/log.hpp"
#include "kube/client.hpp"

namespace gpufence {

// metav1.MicroTime as the API writes it: RFC 3339 in UTC with microseconds.
std::string micro_time(std::chrono::system_clock::time_point t);

// The Event's metadata.name, as client-go's recorder names one (`<regarding name>.<hex of t in
// Unix nanoseconds>`): always a valid DNS-1123 subdomain, whatever `object_name` holds. A name
// that is not one already (no API server stores such an object, but the value is not trusted
// here) is lowercased, every other byte outside [a-z0-9.-] becomes '-', labels are trimmed to
// start and end alphanumeric, empty ones dropped, and the whole is cut to fit 253 characters;
// nothing left gives "gpufence". (A generateName of "<name>." is refused with 422: the API server
// validates the prefix itself as a subdomain, and one ending in '.' is not.)
std::string event_name(std::string_view object_name, std::chrono::system_clock::time_point t);

struct EventSource {
  std::string controller;  // reportingController: a qualified name ("gpufence.io/autoscale")
  std::string instance;    // reportingInstance: this replica or node
};

// The object an Event is about. `ns` empty: cluster-scoped (a Node).
struct EventRegarding {
  std::string api_version, kind, ns, name, uid;
};

struct KubeEvent {
  std::string type = "Normal";  // Normal or Warning
  std::string action;           // what was done or seen ("Scale", "HealthChanged")
  std::string reason;           // at most 128 characters; longer is cut
  std::string note;             // in words, at most 1 kB; longer is cut
};

// The namespace an Event about `regarding` goes into.
std::string event_namespace(const EventRegarding& regarding);
// The Event object (the API's validation: eventTime, action, reportingController and
// reportingInstance are required for new events.k8s.io/v1 Events).
nlohmann::json event_object(const EventRegarding& regarding, const EventSource& source,
                            const KubeEvent& event, std::chrono::system_clock::time_point t);
// POSTs it, once more with a later time when the name is taken.
Status post_event(KubeClient& kube, const EventRegarding& regarding, const EventSource& source,
                  const KubeEvent& event);

// Events posted from a thread of its own, so a slow or unreachable API server never delays the
// caller (the device plugin's health monitor). At most `capacity` wait; past that the oldest is
// dropped and counted. A failed post is logged and counted, never retried.
class EventQueue {
 public:
  // How one Event is posted: post_event on a KubeClient, or a test's stand-in.
  using Post = std::function<Status(const EventRegarding&, const KubeEvent&)>;
  EventQueue(KubeClient& kube, EventSource source, Logger& log, size_t capacity = 64);
  EventQueue(Post post, Logger& log, size_t capacity = 64);
  ~EventQueue();  // posts nothing more; what still waits is dropped
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  void post(EventRegarding regarding, KubeEvent event);
  // Waits until nothing waits or is being posted (tests).
  void drain();
  std::uint64_t dropped() const { return m_dropped; }
  std::uint64_t failed() const { return m_failed; }

 private:
  void serve();
  Post m_post;
  Logger& m_log;
  size_t m_capacity;
  std::mutex m_mu;
  std::condition_variable m_cv;
  std::deque<std::pair<EventRegarding, KubeEvent>> m_waiting;
  bool m_busy = false, m_stopping = false;
  std::atomic<std::uint64_t> m_dropped{0}, m_failed{0};
  std::thread m_thread;
};

}  // namespace gpufence
