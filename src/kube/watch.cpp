#include "kube/watch.hpp"

#include "common/strings.hpp"

namespace gpufence {
namespace {

std::string key_of(const nlohmann::json& object) {
  auto meta = object.value("metadata", nlohmann::json::object());
  return meta.value("namespace", "") + "/" + meta.value("name", "");
}

std::string resource_version_of(const nlohmann::json& object) {
  return object.value("metadata", nlohmann::json::object()).value("resourceVersion", "");
}

bool is_gone(const KubeResponse& r) {
  return r.status == 410 || (r.body.is_object() && r.body.value("code", 0) == 410);
}

std::string status_message(const KubeResponse& r) {
  return r.body.is_object() ? r.body.value("message", "") : "";
}

}  // namespace

WatchCache::WatchCache(KubeClient& kube, std::string collection_path, WatchOptions options)
    : m_kube(kube), m_path(std::move(collection_path)), m_opt(std::move(options)) {}

WatchCache::~WatchCache() {
  stop();
}

std::string WatchCache::query(const std::vector<std::pair<std::string, std::string>>& extra) const {
  std::vector<std::pair<std::string, std::string>> params;
  if (!m_opt.label_selector.empty()) params.emplace_back("labelSelector", m_opt.label_selector);
  if (!m_opt.field_selector.empty()) params.emplace_back("fieldSelector", m_opt.field_selector);
  params.insert(params.end(), extra.begin(), extra.end());
  std::string out;
  for (const auto& [k, v] : params) out += cat(out.empty() ? "?" : "&", k, "=", url_escape(v));
  return m_path + out;
}

void WatchCache::set_error(const Error& e) {
  std::lock_guard lock(m_mu);
  m_last_error = e.message;
}

Status WatchCache::relist() {
  std::map<std::string, nlohmann::json> items;
  std::string cont, rv;
  // Pages: each answer's metadata.continue asks for the next; a continue token too old to serve
  // (410, after about 5 minutes) means starting the list over.
  for (int page = 0;; ++page) {
    std::vector<std::pair<std::string, std::string>> params{
        {"limit", std::to_string(m_opt.page_size)}};
    if (!cont.empty()) params.emplace_back("continue", cont);
    auto answer = m_kube.call("GET", query(params));
    {
      std::lock_guard lock(m_mu);
      ++m_stats.lists;
    }
    if (!answer) {
      set_error(answer.error());
      return std::unexpected(answer.error().wrap("list " + m_path));
    }
    if (is_gone(*answer) && !cont.empty()) {
      items.clear();
      cont.clear();
      if (page > 10) return fail(Errc::rpc, "list ", m_path, ": continue tokens keep expiring");
      continue;
    }
    if (answer->status < 200 || answer->status >= 300) {
      auto e =
          Error{Errc::rpc,
                cat("list ", m_path, ": HTTP ", answer->status,
                    status_message(*answer).empty() ? "" : " (" + status_message(*answer) + ")")};
      set_error(e);
      return std::unexpected(e);
    }
    auto meta = answer->body.value("metadata", nlohmann::json::object());
    if (cont.empty()) rv = meta.value("resourceVersion", "");
    for (const auto& item : answer->body.value("items", nlohmann::json::array()))
      items[key_of(item)] = m_opt.project ? m_opt.project(item) : item;
    cont = meta.value("continue", "");
    if (cont.empty()) break;
  }
  if (rv.empty()) {
    Error e{Errc::parse, cat("list ", m_path, ": no metadata.resourceVersion to watch from")};
    set_error(e);
    return std::unexpected(e);
  }
  std::lock_guard lock(m_mu);
  m_items = std::move(items);
  m_rv = rv;
  m_synced = true;
  m_last_error.clear();
  m_changed.notify_all();
  return {};
}

// One event line; false ends the stream (a 410, or a line that is not an event).
bool WatchCache::apply_event(std::string_view line, Status& error) {
  auto event = nlohmann::json::parse(line, nullptr, false);
  if (!event.is_object() || !event.contains("object") || !event["object"].is_object()) {
    error = fail(Errc::parse, "watch ", m_path, ": not an event: ", line.substr(0, 200));
    return false;
  }
  std::string type = event.value("type", "");
  const auto& object = event["object"];
  std::lock_guard lock(m_mu);
  if (type == "ERROR") {
    KubeResponse r{object.value("code", 0L), object};
    if (is_gone(r)) {
      // The version we watch from is compacted away: the copy may have missed changes.
      ++m_stats.gone;
      m_synced = false;
      m_items.clear();
      return false;
    }
    error = fail(Errc::rpc, "watch ", m_path, ": ", object.value("message", "ERROR event"));
    return false;
  }
  std::string rv = resource_version_of(object);
  if (type == "BOOKMARK") {
    ++m_stats.bookmarks;
  } else if (type == "ADDED" || type == "MODIFIED") {
    m_items[key_of(object)] = m_opt.project ? m_opt.project(object) : object;
    ++m_stats.events;
  } else if (type == "DELETED") {
    m_items.erase(key_of(object));
    ++m_stats.events;
  } else {
    error = fail(Errc::parse, "watch ", m_path, ": unknown event type '", type, "'");
    return false;
  }
  if (!rv.empty()) m_rv = rv;
  m_changed.notify_all();
  return true;
}

Status WatchCache::watch_once(const std::atomic<bool>& stop) {
  std::string from;
  {
    std::lock_guard lock(m_mu);
    if (!m_synced) return fail(Errc::internal, "watch ", m_path, " before a list");
    from = m_rv;
    ++m_stats.watches;
  }
  Status error;
  auto answer = m_kube.stream(
      query({{"watch", "1"},
             {"resourceVersion", from},
             {"allowWatchBookmarks", "true"},
             {"timeoutSeconds", std::to_string(m_opt.watch_timeout.count())}}),
      [&](std::string_view line) { return apply_event(line, error); }, stop,
      m_opt.watch_timeout + std::chrono::seconds(30));
  // A watch that failed may have missed changes the next one cannot replay (its version may
  // be compacted by the time it connects): drop the copy and list again, so a reconcile meanwhile
  // fails ("not listed yet") instead of acting on a copy that silently went stale.
  auto unsync = [this] {
    std::lock_guard lock(m_mu);
    m_synced = false;
    m_items.clear();
  };
  if (!answer) {
    set_error(answer.error());
    unsync();
    return std::unexpected(answer.error());
  }
  if (is_gone(*answer)) {
    std::lock_guard lock(m_mu);
    ++m_stats.gone;
    m_synced = false;
    m_items.clear();
    return {};
  }
  if (answer->status < 200 || answer->status >= 300) {
    Error e{Errc::rpc,
            cat("watch ", m_path, ": HTTP ", answer->status,
                status_message(*answer).empty() ? "" : " (" + status_message(*answer) + ")")};
    set_error(e);
    unsync();
    return std::unexpected(e);
  }
  if (!error) {
    set_error(error.error());
    unsync();
  }
  return error;
}

Status WatchCache::sync(const std::atomic<bool>& stop) {
  bool synced;
  {
    std::lock_guard lock(m_mu);
    synced = m_synced;
  }
  return synced ? watch_once(stop) : relist();
}

void WatchCache::start() {
  m_stop = false;
  m_thread = std::thread([this] {
    while (!m_stop) {
      if (auto st = sync(m_stop); !st) {
        for (int i = 0; i < 20 && !m_stop; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
}

void WatchCache::stop() {
  m_stop = true;
  if (m_thread.joinable()) m_thread.join();
}

Result<std::vector<nlohmann::json>> WatchCache::items() const {
  std::lock_guard lock(m_mu);
  if (!m_synced) {
    return fail(Errc::rpc, m_path, " not listed yet",
                m_last_error.empty() ? "" : " (last error: " + m_last_error + ")");
  }
  std::vector<nlohmann::json> out;
  out.reserve(m_items.size());
  for (const auto& [k, v] : m_items) out.push_back(v);
  return out;
}

std::string WatchCache::resource_version() const {
  std::lock_guard lock(m_mu);
  return m_rv;
}

bool WatchCache::wait_for(const std::function<bool(const std::vector<nlohmann::json>&)>& ready,
                          std::chrono::milliseconds timeout) const {
  std::unique_lock lock(m_mu);
  return m_changed.wait_for(lock, timeout, [&] {
    if (!m_synced) return false;
    std::vector<nlohmann::json> items;
    for (const auto& [k, v] : m_items) items.push_back(v);
    return ready(items);
  });
}

WatchCache::Stats WatchCache::stats() const {
  std::lock_guard lock(m_mu);
  return m_stats;
}

}  // namespace gpufence
