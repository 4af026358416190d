#include "support/test_api_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <sstream>

namespace gpufence::test {
namespace {

const char* kNotFound =
    R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404})";

std::string status_body(int code, const std::string& reason, const std::string& message) {
  return nlohmann::json{
      {"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", nlohmann::json::object()},
      {"status", "Failure"}, {"message", message}, {"reason", reason},
      {"code", code}}
      .dump();
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

std::string key_of(const nlohmann::json& object) {
  auto meta = object.value("metadata", nlohmann::json::object());
  return meta.value("namespace", "") + "/" + meta.value("name", "");
}

// Equality-based label selectors, as kubectl writes them: "a=b", "a==b", "a!=b", "a", "!a".
bool labels_match(const std::string& selector, const nlohmann::json& object) {
  auto labels =
      object.value("metadata", nlohmann::json::object()).value("labels", nlohmann::json::object());
  for (const auto& term : split(selector, ',')) {
    auto ne = term.find("!=");
    auto eq = term.find('=');
    if (ne != std::string::npos) {
      auto k = term.substr(0, ne);
      if (labels.contains(k) && labels[k] == term.substr(ne + 2)) return false;
    } else if (eq != std::string::npos) {
      auto k = term.substr(0, eq);
      auto v = term.substr(term[eq + 1] == '=' ? eq + 2 : eq + 1);
      if (!labels.contains(k) || labels[k] != v) return false;
    } else if (term.front() == '!') {
      if (labels.contains(term.substr(1))) return false;
    } else if (!labels.contains(term)) {
      return false;
    }
  }
  return true;
}

// Field selectors: "status.phase!=Failed,spec.nodeName=gpu-1"; an absent field is "".
bool fields_match(const std::string& selector, const nlohmann::json& object) {
  for (const auto& term : split(selector, ',')) {
    auto ne = term.find("!=");
    auto eq = term.find('=');
    bool negate = ne != std::string::npos;
    auto op = negate ? ne : eq;
    if (op == std::string::npos) return false;
    std::string field = term.substr(0, op);
    std::string want = term.substr(negate ? op + 2 : (term[op + 1] == '=' ? op + 2 : op + 1));
    const nlohmann::json* at = &object;
    for (const auto& part : split(field, '.')) {
      at = at->is_object() && at->contains(part) ? &(*at)[part] : nullptr;
      if (!at) break;
    }
    std::string have = at && at->is_string() ? at->get<std::string>() : "";
    if (field == "spec.unschedulable") have = at && at->is_boolean() && *at ? "true" : "false";
    if ((have == want) == negate) return false;
  }
  return true;
}

void send_all(int conn, const std::string& data) {
  ::send(conn, data.data(), data.size(), MSG_NOSIGNAL);
}

bool send_chunk(int conn, const std::string& data) {
  std::ostringstream hex;
  hex << std::hex << data.size();
  std::string chunk = hex.str() + "\r\n" + data + "\r\n";
  return ::send(conn, chunk.data(), chunk.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(chunk.size());
}

bool peer_closed(int conn) {
  char c;
  ssize_t n = ::recv(conn, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// --- What the API server validates on create (k8s.io/apimachinery pkg/util/validation and
// pkg/api/validation, kubernetes pkg/apis/core/validation/events.go), written here from those
// rules and not shared with the code under test, so a client's mistake is refused as the real
// server refuses it. ---

const char* kSubdomainMessage =
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

// IsDNS1123Subdomain.
std::vector<std::string> subdomain_errors(const std::string& value) {
  static const std::regex re("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  std::vector<std::string> out;
  if (value.size() > 253) out.push_back("must be no more than 253 characters");
  if (!std::regex_match(value, re)) out.push_back(kSubdomainMessage);
  return out;
}

// IsDNS1123Label (a namespace).
bool is_label(const std::string& value) {
  static const std::regex re("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return value.size() <= 63 && std::regex_match(value, re);
}

// IsQualifiedName: [prefix/]name, the name at most 63 of [-A-Za-z0-9_.] starting and ending
// alphanumeric, the prefix a DNS-1123 subdomain.
bool is_qualified_name(const std::string& value) {
  static const std::regex name("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]");
  auto slash = value.find('/');
  std::string part = slash == std::string::npos ? value : value.substr(slash + 1);
  if (slash != std::string::npos &&
      (value.find('/', slash + 1) != std::string::npos || slash == 0 ||
       !subdomain_errors(value.substr(0, slash)).empty()))
    return false;
  return !part.empty() && part.size() <= 63 && std::regex_match(part, name);
}

// NameIsDNSSubdomain(generateName, prefix=true): the prefix is validated itself, after
// maskTrailingDash (which, as upstream's does, replaces the last two characters by "a" when the
// prefix ends in '-'). So "deepstream-" passes and "deepstream." does not.
std::vector<std::string> generate_name_errors(const std::string& prefix) {
  std::string masked = prefix;
  if (!masked.empty() && masked.back() == '-')
    masked = masked.substr(0, masked.size() >= 2 ? masked.size() - 2 : 0) + "a";
  return subdomain_errors(masked);
}

// names.SimpleNameGenerator: the prefix cut to 58 characters, then 5 of its alphabet.
std::string generated_name(const std::string& prefix, int n) {
  static const std::string alphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::string out = prefix.substr(0, 58);
  for (int i = 0; i < 5; ++i, n /= static_cast<int>(alphabet.size()))
    out += alphabet[static_cast<size_t>(n) % alphabet.size()];
  return out;
}

std::string field_text(const nlohmann::json& object, const char* key) {
  return object.contains(key) && object[key].is_string() ? object[key].get<std::string>() : "";
}

// ValidateEventCreate for events.k8s.io/v1 (the strict part and legacyValidateEvent).
void event_errors(const nlohmann::json& e, const std::string& ns, std::vector<std::string>& out) {
  auto required = [&](const char* key, const char* field) {
    if (field_text(e, key).empty()) out.push_back(std::string(field) + ": Required value");
  };
  auto at_most = [&](const char* key, const char* field, size_t n) {
    if (field_text(e, key).size() > n)
      out.push_back(std::string(field) + ": Invalid value: \"\": can have at most " +
                    std::to_string(n) + " characters");
  };
  required("eventTime", "eventTime");
  std::string type = field_text(e, "type");
  if (type != "Normal" && type != "Warning")
    out.push_back("type: Invalid value: \"\": has invalid value: " + type);
  required("reportingController", "reportingController");
  if (!field_text(e, "reportingController").empty() &&
      !is_qualified_name(field_text(e, "reportingController")))
    out.push_back("reportingController: Invalid value: \"" + field_text(e, "reportingController") +
                  "\": must be a qualified name");
  required("reportingInstance", "reportingInstance");
  at_most("reportingInstance", "reportingInstance", 128);
  required("action", "action");
  at_most("action", "action", 128);
  required("reason", "reason");
  at_most("reason", "reason", 128);
  at_most("note", "message", 1024);
  for (const char* unset : {"deprecatedFirstTimestamp", "deprecatedLastTimestamp",
                            "deprecatedCount", "deprecatedSource"}) {
    if (e.contains(unset) && !e[unset].is_null())
      out.push_back(std::string(unset) + ": Invalid value: \"\": needs to be unset");
  }
  auto regarding = e.value("regarding", nlohmann::json::object());
  if (field_text(regarding, "namespace").empty() && ns != "default" && ns != "kube-system")
    out.push_back("involvedObject.namespace: Invalid value: \"\": does not match event.namespace");
  if (e.contains("series") && e["series"].is_object() && e["series"].value("count", 0) < 2)
    out.push_back("series.count: Invalid value: \"\": should be at least 2");
}

// The collection path's namespace (".../namespaces/NS/kind"), or "".
std::string path_namespace(const std::string& path) {
  auto parts = split(path, '/');
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    if (parts[i] == "namespaces") return parts[i + 1];
  return "";
}

}  // namespace

TestApiServer::TestApiServer() {
  m_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(m_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::listen(m_fd, 64);
  socklen_t len = sizeof addr;
  ::getsockname(m_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  m_port = ntohs(addr.sin_port);
  [[maybe_unused]] int rc = ::pipe(m_stop);
  m_thread = std::thread([this] { serve(); });
}

TestApiServer::~TestApiServer() {
  char c = 'x';
  [[maybe_unused]] auto n = ::write(m_stop[1], &c, 1);
  m_thread.join();
  {
    std::lock_guard lock(m_mu);
    m_stopping = true;
  }
  m_changed.notify_all();
  for (auto& t : m_connections) t.join();
  ::close(m_fd);
  ::close(m_stop[0]);
  ::close(m_stop[1]);
}

void TestApiServer::set(const std::string& path, int status, const std::string& body) {
  std::lock_guard lock(m_mu);
  m_answers[path] = {status, body};
}

void TestApiServer::clear(const std::string& path) {
  std::lock_guard lock(m_mu);
  m_answers.erase(path);
}

void TestApiServer::set_versioned(const std::string& path, nlohmann::json object) {
  std::lock_guard lock(m_mu);
  bump(object);
  m_objects[path] = std::move(object);
}

nlohmann::json TestApiServer::object(const std::string& path) {
  std::lock_guard lock(m_mu);
  return m_objects[path];
}

void TestApiServer::remove_object(const std::string& path) {
  std::lock_guard lock(m_mu);
  m_objects.erase(path);
}

bool TestApiServer::has_object(const std::string& path) {
  std::lock_guard lock(m_mu);
  return m_objects.contains(path);
}

std::vector<nlohmann::json> TestApiServer::posted(const std::string& collection) {
  std::lock_guard lock(m_mu);
  return m_posted[collection];
}

long TestApiServer::bump(nlohmann::json& object) {
  object["metadata"]["resourceVersion"] = std::to_string(++m_rv);
  return m_rv;
}

void TestApiServer::record(const std::string& collection, const std::string& type,
                           nlohmann::json object, nlohmann::json old) {
  m_history.push_back({m_rv, collection, type, std::move(object), std::move(old)});
  m_changed.notify_all();
}

void TestApiServer::apply(const std::string& collection, nlohmann::json object) {
  std::lock_guard lock(m_mu);
  auto& items = m_collections[collection];
  std::string key = key_of(object);
  bump(object);
  auto it = items.find(key);
  nlohmann::json old = it == items.end() ? nlohmann::json() : it->second;
  items[key] = object;
  record(collection, old.is_null() ? "ADDED" : "MODIFIED", object, old);
}

void TestApiServer::remove(const std::string& collection, const std::string& ns,
                           const std::string& name) {
  std::lock_guard lock(m_mu);
  auto& items = m_collections[collection];
  auto it = items.find(ns + "/" + name);
  if (it == items.end()) return;
  nlohmann::json old = it->second;
  items.erase(it);
  nlohmann::json gone = old;
  bump(gone);
  record(collection, "DELETED", gone, old);
}

void TestApiServer::compact() {
  std::lock_guard lock(m_mu);
  m_compacted_rv = m_rv;
  m_changed.notify_all();
}

void TestApiServer::bookmark() {
  std::lock_guard lock(m_mu);
  m_history.push_back({m_rv, "", "BOOKMARK", {}, {}});
  m_changed.notify_all();
}

void TestApiServer::end_watches() {
  std::lock_guard lock(m_mu);
  ++m_watch_epoch;
  m_changed.notify_all();
}

int TestApiServer::lists(const std::string& collection) {
  std::lock_guard lock(m_mu);
  return m_lists[collection];
}

int TestApiServer::watches(const std::string& collection) {
  std::lock_guard lock(m_mu);
  return m_watches[collection];
}

int TestApiServer::open_watches() {
  std::lock_guard lock(m_mu);
  return m_open_watches;
}

std::string TestApiServer::resource_version() {
  std::lock_guard lock(m_mu);
  return std::to_string(m_rv);
}

std::vector<std::string> TestApiServer::requests() {
  std::lock_guard lock(m_mu);
  return m_requests;
}

void TestApiServer::require_token(const std::string& token) {
  std::lock_guard lock(m_mu);
  m_token = token;
}

std::string TestApiServer::kubeconfig(const std::string& token) const {
  return "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: c\n  cluster:\n  "
         "  server: " +
         url() +
         "\ncontexts:\n- name: test\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  "
         "user:\n    token: " +
         token + "\n";
}

void TestApiServer::serve() {
  while (true) {
    pollfd fds[2] = {{m_fd, POLLIN, 0}, {m_stop[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents) return;
    int conn = ::accept(m_fd, nullptr, nullptr);
    if (conn < 0) continue;
    m_connections.emplace_back([this, conn] {
      handle(conn);
      ::close(conn);
    });
  }
}

void TestApiServer::handle(int conn) {
  std::string raw;
  char buf[4096];
  while (raw.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::recv(conn, buf, sizeof buf, 0);
    if (n <= 0) return;
    raw.append(buf, static_cast<size_t>(n));
  }
  size_t header_end = raw.find("\r\n\r\n");
  std::string headers = raw.substr(0, header_end);
  std::string lower = headers;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  size_t length = 0;
  if (auto cl = lower.find("content-length: "); cl != std::string::npos)
    length = std::stoul(headers.substr(cl + 16));
  while (raw.size() < header_end + 4 + length) {
    ssize_t n = ::recv(conn, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  Request req;
  req.method = raw.substr(0, raw.find(' '));
  req.target = raw.substr(req.method.size() + 1,
                          raw.find(' ', req.method.size() + 1) - req.method.size() - 1);
  auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) {
    for (const auto& kv : split(req.target.substr(q + 1), '&')) {
      auto eq = kv.find('=');
      req.query[percent_decode(kv.substr(0, eq))] =
          eq == std::string::npos ? "" : percent_decode(kv.substr(eq + 1));
    }
  }
  req.body = raw.substr(header_end + 4);
  if (auto a = lower.find("authorization: "); a != std::string::npos)
    req.authorization = headers.substr(a + 15, headers.find("\r\n", a) - a - 15);
  if (auto a = lower.find("content-type: "); a != std::string::npos)
    req.content_type = headers.substr(a + 14, headers.find("\r\n", a) - a - 14);

  bool is_watch =
      req.method == "GET" && (req.query["watch"] == "1" || req.query["watch"] == "true");
  bool is_collection = false;
  {
    std::lock_guard lock(m_mu);
    m_requests.push_back(req.method + " " + req.target);
    is_collection = m_collections.contains(req.path) && !m_answers.contains(req.target) &&
                    !m_answers.contains(req.path);
    if (is_watch && is_collection && (m_token.empty() || req.authorization == "Bearer " + m_token))
      ++m_watches[req.path];
  }
  Answer a;
  if (is_watch && is_collection && m_gone_as_status) {
    std::lock_guard lock(m_mu);
    auto rv = req.query.contains("resourceVersion") ? req.query.at("resourceVersion") : "";
    if (!rv.empty() && std::stol(rv) < m_compacted_rv) {
      std::string body = status_body(410, "Expired", "too old resource version: " + rv);
      send_all(conn, "HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
      return;
    }
  }
  if (is_watch && is_collection) {
    std::unique_lock lock(m_mu);
    bool authorised = m_token.empty() || req.authorization == "Bearer " + m_token;
    if (!authorised) ++m_unauthorized;
    lock.unlock();
    if (authorised) return watch(conn, req);
    a = {401, status_body(401, "Unauthorized", "Unauthorized")};
  } else {
    a = answer(req);
  }
  send_all(conn, "HTTP/1.1 " + std::to_string(a.status) +
                     " X\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(a.body.size()) + "\r\nConnection: close\r\n\r\n" + a.body);
}

TestApiServer::Answer TestApiServer::answer(const Request& req) {
  std::lock_guard lock(m_mu);
  if (!m_token.empty() && req.authorization != "Bearer " + m_token) {
    ++m_unauthorized;
    return {401, status_body(401, "Unauthorized", "Unauthorized")};
  }
  if (auto it = m_answers.find(req.target); it != m_answers.end()) return it->second;
  if (auto it = m_answers.find(req.path); it != m_answers.end()) return it->second;
  if (req.method == "POST") {
    nlohmann::json sent = nlohmann::json::parse(req.body, nullptr, false);
    if (!sent.is_object()) return {400, status_body(400, "BadRequest", "body is not an object")};
    auto& meta = sent["metadata"];
    if (!meta.is_object()) meta = nlohmann::json::object();
    const std::string ns = path_namespace(req.path);
    if (!ns.empty() && meta.contains("namespace") && meta["namespace"] != ns)
      return {400, status_body(400, "BadRequest",
                               "the namespace of the provided object does not match the "
                               "namespace sent on the request")};
    // The name first (BeforeCreate), then ValidateObjectMeta over generateName and name.
    std::string generate = field_text(meta, "generateName");
    std::string name = field_text(meta, "name");
    if (name.empty() && !generate.empty()) name = generated_name(generate, ++m_generated);
    std::vector<std::string> errors;
    if (!generate.empty())
      for (const auto& msg : generate_name_errors(generate))
        errors.push_back("metadata.generateName: Invalid value: \"" + generate + "\": " + msg);
    if (name.empty()) {
      errors.push_back("metadata.name: Required value: name or generateName is required");
    } else {
      for (const auto& msg : subdomain_errors(name))
        errors.push_back("metadata.name: Invalid value: \"" + name + "\": " + msg);
    }
    if (!ns.empty() && !is_label(ns))
      errors.push_back("metadata.namespace: Invalid value: \"" + ns + "\"");
    if (sent.value("apiVersion", "") == "events.k8s.io/v1" && sent.value("kind", "") == "Event")
      event_errors(sent, ns, errors);
    if (!errors.empty()) {
      std::string kind = sent.value("kind", "Object");
      std::string group = sent.value("apiVersion", "v1");
      group = group.find('/') == std::string::npos ? "" : "." + group.substr(0, group.find('/'));
      std::string list = errors.size() == 1 ? errors[0] : "[" + errors[0];
      for (size_t i = 1; i < errors.size(); ++i) list += ", " + errors[i];
      if (errors.size() > 1) list += "]";
      ++m_rejected;
      return {422,
              status_body(422, "Invalid", kind + group + " \"" + name + "\" is invalid: " + list)};
    }
    meta["name"] = name;
    if (!ns.empty()) meta["namespace"] = ns;
    std::string path = req.path + "/" + name;
    if (m_objects.contains(path))
      return {409, status_body(409, "AlreadyExists", "\"" + name + "\" already exists")};
    bump(sent);
    m_objects[path] = sent;
    m_posted[req.path].push_back(sent);
    return {201, sent.dump()};
  }
  if (req.method == "PATCH") return patch(req);
  if (auto obj = m_objects.find(req.path); obj != m_objects.end()) {
    if (req.method != "PUT") return {200, obj->second.dump()};
    ++m_puts;
    if (m_race) {
      bump(obj->second);
      m_race = false;
    }
    nlohmann::json sent = nlohmann::json::parse(req.body, nullptr, false);
    if (m_fail_put) {
      Answer a{m_fail_put, R"({"kind":"Status","message":"etcdserver: request timed out","code":)" +
                               std::to_string(m_fail_put) + "}"};
      m_fail_put = 0;
      return a;
    }
    if (sent.is_discarded() ||
        sent["metadata"]["resourceVersion"] != obj->second["metadata"]["resourceVersion"]) {
      return {409, status_body(409, "Conflict",
                               "Operation cannot be fulfilled: the object has been modified; "
                               "please apply your changes to the latest version and try again")};
    }
    obj->second = sent;
    bump(obj->second);
    return {200, obj->second.dump()};
  }
  if (req.method == "GET" && m_collections.contains(req.path)) return list(req);
  return {404, kNotFound};
}

namespace {

// A strategic merge patch of `patch` into `into`: objects key by key (null deletes), lists
// replaced, except status.conditions, merged by type.
void strategic_merge(nlohmann::json& into, const nlohmann::json& patch, const std::string& at) {
  for (const auto& [key, value] : patch.items()) {
    const std::string path = at + "." + key;
    if (value.is_null()) {
      into.erase(key);
    } else if (path == ".status.conditions" && value.is_array()) {
      auto& list = into[key];
      if (!list.is_array()) list = nlohmann::json::array();
      for (const auto& c : value) {
        auto same = std::find_if(list.begin(), list.end(), [&](const nlohmann::json& e) {
          return e.value("type", "") == c.value("type", "");
        });
        if (same == list.end())
          list.push_back(c);
        else
          strategic_merge(*same, c, path + "[]");
      }
    } else if (value.is_object() && into.contains(key) && into[key].is_object()) {
      strategic_merge(into[key], value, path);
    } else {
      into[key] = value;
    }
  }
}

}  // namespace

// Under m_mu.
TestApiServer::Answer TestApiServer::patch(const Request& req) {
  ++m_patches;
  const std::string suffix = "/status";
  if (req.path.size() <= suffix.size() || !req.path.ends_with(suffix))
    return {405, status_body(405, "MethodNotAllowed", "only /status is patched here")};
  auto obj = m_objects.find(req.path.substr(0, req.path.size() - suffix.size()));
  if (obj == m_objects.end()) return {404, kNotFound};
  if (req.content_type != "application/strategic-merge-patch+json")
    return {415, status_body(415, "UnsupportedMediaType",
                             "the body of the request was in an unknown format - accepted media "
                             "types include: application/json-patch+json, "
                             "application/merge-patch+json, application/apply-patch+yaml, "
                             "application/strategic-merge-patch+json")};
  nlohmann::json sent = nlohmann::json::parse(req.body, nullptr, false);
  if (!sent.is_object()) return {400, status_body(400, "BadRequest", "body is not an object")};
  // A status patch changes only the status, as the status subresource does.
  nlohmann::json only_status = nlohmann::json::object();
  if (sent.contains("status")) only_status["status"] = sent["status"];
  strategic_merge(obj->second, only_status, "");
  bump(obj->second);
  return {200, obj->second.dump()};
}

// Under m_mu.
TestApiServer::Answer TestApiServer::list(const Request& req) {
  ++m_lists[req.path];
  auto q = [&](const std::string& k) {
    auto it = req.query.find(k);
    return it == req.query.end() ? std::string() : it->second;
  };
  long rv = m_rv;
  std::string after;
  if (auto token = q("continue"); !token.empty()) {
    auto bar = token.find('|');
    rv = std::stol(token.substr(0, bar));
    after = token.substr(bar + 1);
    if (rv < m_compacted_rv)
      return {410, status_body(410, "Expired",
                               "The provided continue parameter is too old to display a "
                               "consistent list result. You can start a new list without the "
                               "continue parameter.")};
  }
  long limit = q("limit").empty() ? 0 : std::stol(q("limit"));
  nlohmann::json items = nlohmann::json::array();
  std::string last, next;
  for (const auto& [key, object] : m_collections[req.path]) {
    if (!after.empty() && key <= after) continue;
    if (!labels_match(q("labelSelector"), object) || !fields_match(q("fieldSelector"), object))
      continue;
    if (limit > 0 && static_cast<long>(items.size()) == limit) {
      next = std::to_string(rv) + "|" + last;
      break;
    }
    items.push_back(object);
    last = key;
  }
  nlohmann::json out{{"kind", "List"},
                     {"apiVersion", "v1"},
                     {"metadata", {{"resourceVersion", std::to_string(rv)}}},
                     {"items", items}};
  if (!next.empty()) out["metadata"]["continue"] = next;
  return {200, out.dump()};
}

void TestApiServer::watch(int conn, const Request& req) {
  auto q = [&](const std::string& k) {
    auto it = req.query.find(k);
    return it == req.query.end() ? std::string() : it->second;
  };
  send_all(conn,
           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: "
           "chunked\r\n\r\n");
  const bool bookmarks = q("allowWatchBookmarks") == "true" || q("allowWatchBookmarks") == "1";
  const long from = q("resourceVersion").empty() ? 0 : std::stol(q("resourceVersion"));
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::seconds(q("timeoutSeconds").empty() ? 3600 : std::stol(q("timeoutSeconds")));
  std::unique_lock lock(m_mu);
  ++m_open_watches;
  const long epoch = m_watch_epoch;
  std::vector<std::string> out;
  if (from < m_compacted_rv) {
    // What the real server sends for a watch from a compacted revision: 200, then one ERROR.
    out.push_back(
        nlohmann::json{{"type", "ERROR"},
                       {"object", nlohmann::json::parse(status_body(
                                      410, "Expired",
                                      "too old resource version: " + std::to_string(from) + " (" +
                                          std::to_string(m_compacted_rv) + ")"))}}
            .dump() +
        "\n");
  }
  size_t pos = 0;
  while (pos < m_history.size() && m_history[pos].rv <= from) ++pos;
  bool done = !out.empty();
  while (true) {
    for (; !done && pos < m_history.size(); ++pos) {
      const Change& c = m_history[pos];
      if (c.type == "BOOKMARK") {
        if (bookmarks)
          out.push_back(
              nlohmann::json{{"type", "BOOKMARK"},
                             {"object",
                              {{"kind", "Bookmark"},
                               {"metadata", {{"resourceVersion", std::to_string(c.rv)}}}}}}
                  .dump() +
              "\n");
        continue;
      }
      if (c.collection != req.path) continue;
      auto matches = [&](const nlohmann::json& o) {
        return !o.is_null() && labels_match(q("labelSelector"), o) &&
               fields_match(q("fieldSelector"), o);
      };
      bool was = matches(c.old), is = c.type != "DELETED" && matches(c.object);
      std::string type = is && was ? "MODIFIED" : is ? "ADDED" : was ? "DELETED" : "";
      if (type.empty()) continue;
      out.push_back(nlohmann::json{{"type", type}, {"object", c.object}}.dump() + "\n");
    }
    lock.unlock();
    bool sent = true;
    for (const auto& line : out) sent = sent && send_chunk(conn, line);
    out.clear();
    if (done || !sent || peer_closed(conn)) break;
    lock.lock();
    m_changed.wait_for(lock, std::chrono::milliseconds(50));
    if (m_stopping || m_watch_epoch != epoch || std::chrono::steady_clock::now() > deadline) {
      lock.unlock();
      break;
    }
  }
  send_all(conn, "0\r\n\r\n");
  lock.lock();
  --m_open_watches;
}

}  // namespace gpufence::test
