// A test Kubernetes API server: no API server can be installed here, so this one serves, over
// plain HTTP on loopback (the client's TLS setup is not exercised), with the API's own Status
// bodies on errors:
//  - fixed answers for exact paths (`set`), which win over everything below;
//  - versioned objects: GET, PUT with optimistic concurrency (409 on a stale resourceVersion, as
//    the real one answers), POST into a collection (409 AlreadyExists), 404 for unknown paths;
//  - PATCH of an object's `/status` as a strategic merge patch (Content-Type
//    application/strategic-merge-patch+json, else 415): objects merged key by key, and
//    status.conditions merged by `type` as the Node's patchMergeKey says;
//  - a POST validated as the API server validates a create: metadata.generateName (itself a
//    DNS-1123 subdomain prefix: "name." is refused), the name generated from it (the prefix cut
//    to 58, then 5 characters) or given (a DNS-1123 subdomain), the namespace (a DNS-1123 label,
//    and the request's), and for an events.k8s.io/v1 Event its own required fields and limits;
//    what fails is 422 Invalid with the API's message and is not stored;
//  - collections with list and watch as the API defines them (docs/autoscale.md, "List and
//    watch"): one resourceVersion counter for everything (etcd's revision), label and field
//    selectors, limit/continue pagination, ?watch=1 streams of ADDED/MODIFIED/DELETED (an object
//    leaving a field selector is DELETED to that watch), BOOKMARK on request, and 410 Gone once the
//    history a watch or continue token needs has been compacted away.
// Each connection gets its own thread, so a watch stream does not block other clients.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace gpufence::test {

class TestApiServer {
 public:
  struct Answer {
    int status = 200;
    std::string body;
  };
  TestApiServer();
  ~TestApiServer();
  // A fixed answer for `path`: the exact request target, or the path without its query.
  void set(const std::string& path, int status, const std::string& body);
  void clear(const std::string& path);
  // An object PUT can replace: a PUT whose metadata.resourceVersion is stale gets 409, as the
  // API server answers; a good one bumps the version.
  void set_versioned(const std::string& path, nlohmann::json object);
  nlohmann::json object(const std::string& path);
  bool has_object(const std::string& path);
  // Deletes a versioned object (as a DELETE by someone else would).
  void remove_object(const std::string& path);
  // The next PUT finds the object changed by someone else first (its write gets 409).
  void race_next_put() { m_race = true; }
  // The next PUT is answered with this status (e.g. 503) and changes nothing.
  void fail_next_put(int status) { m_fail_put = status; }
  int puts() const { return m_puts; }
  int patches() {
    std::lock_guard lock(m_mu);
    return m_patches;
  }
  // POSTs refused with 422 Invalid.
  int rejected() {
    std::lock_guard lock(m_mu);
    return m_rejected;
  }
  // Objects POSTed into `collection` (".../namespaces/video/events"), in order.
  std::vector<nlohmann::json> posted(const std::string& collection);

  // Collections served with list and watch ("/api/v1/pods", "/api/v1/nodes"). Objects are keyed
  // by namespace/name; apply creates or replaces (ADDED or MODIFIED), remove deletes.
  void apply(const std::string& collection, nlohmann::json object);
  void remove(const std::string& collection, const std::string& ns, const std::string& name);
  // Forget the history so far: a watch from an older resourceVersion gets a 410 ERROR event and
  // a continue token from before gets HTTP 410, as after etcd's compaction.
  void compact();
  // Answer a watch from a compacted version with HTTP 410 instead of 200 and an ERROR event
  // (servers and proxies differ; a client must handle both).
  void gone_as_http_status(bool yes) { m_gone_as_status = yes; }
  // A BOOKMARK carrying the current resourceVersion to every watch that allowed bookmarks.
  void bookmark();
  // Ends every open watch stream, as the server does at timeoutSeconds.
  void end_watches();
  int lists(const std::string& collection);
  int watches(const std::string& collection);
  int open_watches();
  std::string resource_version();

  // Requests without "Authorization: Bearer <token>" get 401 (empty: no check).
  void require_token(const std::string& token);
  int unauthorized() const { return m_unauthorized; }

  // Every request so far as "METHOD target" (target with its query), in arrival order.
  std::vector<std::string> requests();

  std::string url() const { return "http://127.0.0.1:" + std::to_string(m_port); }
  // A kubeconfig (written to `path`) whose current context points at this server.
  std::string kubeconfig(const std::string& token = "test-token") const;

 private:
  struct Request {
    std::string method, target, path, body, authorization, content_type;
    std::map<std::string, std::string> query;
  };
  struct Change {
    long rv = 0;
    std::string collection, type;  // ADDED, MODIFIED, DELETED
    nlohmann::json object, old;    // old: null for ADDED
  };
  void serve();
  void handle(int conn);
  Answer answer(const Request& req);
  Answer list(const Request& req);
  Answer patch(const Request& req);
  void watch(int conn, const Request& req);
  long bump(nlohmann::json& object);  // the next resourceVersion, written into the object
  void record(const std::string& collection, const std::string& type, nlohmann::json object,
              nlohmann::json old);

  int m_fd = -1;
  int m_port = 0;
  int m_stop[2] = {-1, -1};
  std::mutex m_mu;
  std::condition_variable m_changed;
  bool m_stopping = false;
  long m_rv = 1;            // the last resourceVersion handed out
  long m_compacted_rv = 0;  // history at or before this is gone
  long m_watch_epoch = 0;   // end_watches() bumps it
  std::vector<Change> m_history;
  std::map<std::string, std::map<std::string, nlohmann::json>> m_collections;
  std::map<std::string, int> m_lists, m_watches;
  int m_open_watches = 0;
  std::map<std::string, Answer> m_answers;
  std::map<std::string, nlohmann::json> m_objects;
  std::map<std::string, std::vector<nlohmann::json>> m_posted;
  std::vector<std::string> m_requests;
  std::string m_token;
  int m_unauthorized = 0;
  std::atomic<bool> m_gone_as_status{false};
  bool m_race = false;
  int m_fail_put = 0;
  int m_puts = 0;
  int m_patches = 0;
  int m_generated = 0;
  int m_rejected = 0;
  std::thread m_thread;
  std::vector<std::thread> m_connections;
};

}  // namespace gpufence::test
