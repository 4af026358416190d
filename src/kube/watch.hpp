// A local copy of one API collection kept current by list + watch, as client-go's reflector does
// (docs/autoscale.md, "List and watch"): list every page (limit/continue), then watch from the
// list's resourceVersion and apply ADDED/MODIFIED/DELETED; BOOKMARK only moves the version on; a
// 410 Gone (an ERROR event or the HTTP status: the version was compacted away) clears the copy and
// lists again. So a period costs no request at all when nothing changed, instead of a full list.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kube/client.hpp"

namespace gpufence {

struct WatchOptions {
  std::string label_selector, field_selector;
  long page_size = 500;
  // The server ends each watch after this (timeoutSeconds); the next one resumes from the last
  // resourceVersion seen.
  std::chrono::seconds watch_timeout{300};
  // Keeps only what the user needs of each object (a pod's full spec is large).
  std::function<nlohmann::json(const nlohmann::json&)> project;
};

class WatchCache {
 public:
  WatchCache(KubeClient& kube, std::string collection_path, WatchOptions options = {});
  ~WatchCache();
  WatchCache(const WatchCache&) = delete;
  WatchCache& operator=(const WatchCache&) = delete;

  // Lists every page into the copy; the list's resourceVersion is where the next watch starts.
  Status relist();
  // One watch request from the last resourceVersion, applied until the server ends the stream,
  // `stop` is set or an error comes. After a 410 the copy is unsynced and the next sync() lists.
  Status watch_once(const std::atomic<bool>& stop);
  // What a loop does: list when unsynced, else watch once.
  Status sync(const std::atomic<bool>& stop);
  // sync() on a thread until stop(), pausing a little after errors (they are kept for items()).
  void start();
  void stop();

  // The objects, keyed namespace/name; an error while the copy is not synced (never listed, or
  // cleared by a 410 and not yet listed again), naming the collection and the last failure.
  Result<std::vector<nlohmann::json>> items() const;
  std::string resource_version() const;
  // Waits (up to `timeout`) until `ready` holds for the copy; for callers that must see a change.
  bool wait_for(const std::function<bool(const std::vector<nlohmann::json>&)>& ready,
                std::chrono::milliseconds timeout) const;

  struct Stats {
    int lists = 0, watches = 0, gone = 0, bookmarks = 0, events = 0;
  };
  Stats stats() const;

 private:
  std::string query(const std::vector<std::pair<std::string, std::string>>& extra) const;
  bool apply_event(std::string_view line, Status& error);
  void set_error(const Error& e);

  KubeClient& m_kube;
  std::string m_path;
  WatchOptions m_opt;
  mutable std::mutex m_mu;
  mutable std::condition_variable m_changed;
  std::map<std::string, nlohmann::json> m_items;
  std::string m_rv;
  bool m_synced = false;
  std::string m_last_error;
  Stats m_stats;
  std::atomic<bool> m_stop{false};
  std::thread m_thread;
};

}  // namespace gpufence
